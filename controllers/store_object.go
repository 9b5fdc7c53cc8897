package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// storeObject is a Pool or a Container: a Kubernetes object that stands for an object of the
// store, created (or adopted) through the management service, whose status is copied from it.
type storeObject interface {
	client.Object
	StatusConditions() *[]metav1.Condition
	ObserveGeneration()
}

// storeReconciler is what the Pool and Container reconcilers share: the refresh period, the
// Ready condition, the status patch that ends a reconcile, the reason of a failed management call
// and the deletion flow.
type storeReconciler struct {
	client.Client
	recorder record.EventRecorder
	ms       *ManagementServices
	// refresh is how often the status is re-read from the management service (0: 30 s).
	refresh time.Duration
}

// defaultRefresh is how often a Pool's or Container's status is re-read when nothing wakes it.
const defaultRefresh = 30 * time.Second

// requeue is the result of a reconcile that went through: back after the refresh period.
func (s storeReconciler) requeue() ctrl.Result {
	if s.refresh == 0 {
		return ctrl.Result{RequeueAfter: defaultRefresh}
	}
	return ctrl.Result{RequeueAfter: s.refresh}
}

// setReady sets the Ready condition.
func setReady(o storeObject, st metav1.ConditionStatus, reason storagev1.ConditionReason, msg string) {
	setCondition(o.StatusConditions(), o.GetGeneration(), storagev1.ConditionReady, st, reason, msg)
}

// finish writes the status as a patch against what was read, then returns res and err.
func (s storeReconciler) finish(ctx context.Context, o, before storeObject, res ctrl.Result, err error) (ctrl.Result, error) {
	o.ObserveGeneration()
	if perr := s.Status().Patch(ctx, o, client.MergeFrom(before)); perr != nil && !apierrors.IsNotFound(perr) {
		return ctrl.Result{}, perr
	}
	return res, err
}

// callFailureReason is the Ready reason of a failed management call: unreachable when the service
// did not answer, an error otherwise.
func callFailureReason(err error) storagev1.ConditionReason {
	switch grpcCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return storagev1.ReasonManagementServiceUnreachable
	}
	return storagev1.ReasonManagementServiceError
}

// callFailed ends a reconcile whose management call failed: Ready False saying why, a warning
// event, and the error back to controller-runtime (retried with exponential backoff).
func (s storeReconciler) callFailed(ctx context.Context, o, before storeObject, err error) (ctrl.Result, error) {
	reason := callFailureReason(err)
	setReady(o, metav1.ConditionFalse, reason, err.Error())
	s.recorder.Event(o, corev1.EventTypeWarning, string(reason), err.Error())
	return s.finish(ctx, o, before, ctrl.Result{}, err)
}

// storeDeletion is how one Pool or Container is released from the store when its object goes.
type storeDeletion struct {
	// kind is "pool" or "container", as events name it.
	kind string
	// label and uuid name the store's object; uuid "" when it was never created.
	label, uuid string
	reclaim     storagev1.ReclaimPolicy
	// address finds the management service; its error means there is no store to release from.
	address func(context.Context) (mgmtTarget, error)
	// destroy asks the management service to destroy it.
	destroy func(context.Context, mgmtpb.MgmtClient) error
	// forgetMetrics drops the object's metrics.
	forgetMetrics func()
}

func (d *storeDeletion) what() string { return fmt.Sprintf("%s %q (%s)", d.kind, d.label, d.uuid) }

// reconcileDelete releases the store's object (reclaim policy Delete) or leaves it (Retain), then
// lets the Kubernetes object go. Without a management service to ask (the ServerSet or the Pool is
// gone) the object is left in the store, with a warning event; a refusal of the store holds the
// deletion (DeletionBlocked DestroyFailed) and is retried.
func (s storeReconciler) reconcileDelete(ctx context.Context, o, before storeObject, d storeDeletion) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(o, storagev1.Finalizer) {
		return ctrl.Result{}, nil
	}
	if d.reclaim != storagev1.ReclaimRetain && d.uuid != "" {
		addr, err := d.address(ctx)
		if err != nil {
			s.recorder.Eventf(o, corev1.EventTypeWarning, titleWord(d.kind)+"NotDestroyed", "%s left in the store: %v", d.what(), err)
		} else if err := s.destroy(ctx, o, addr, &d); err != nil {
			setCondition(o.StatusConditions(), o.GetGeneration(), storagev1.ConditionDeletionBlocked, metav1.ConditionTrue, storagev1.ReasonDestroyFailed, err.Error())
			s.recorder.Event(o, corev1.EventTypeWarning, string(storagev1.ReasonDestroyFailed), err.Error())
			return s.finish(ctx, o, before, ctrl.Result{}, err)
		}
	} else if d.uuid != "" {
		s.recorder.Eventf(o, corev1.EventTypeNormal, "Retained", "%s retained in the store", d.what())
	}
	d.forgetMetrics()
	controllerutil.RemoveFinalizer(o, storagev1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(s.Update(ctx, o))
}

// destroy destroys the store's object; one the store does not have is destroyed already.
func (s storeReconciler) destroy(ctx context.Context, o storeObject, addr mgmtTarget, d *storeDeletion) error {
	ms, err := s.ms.Client(addr)
	if err != nil {
		return err
	}
	cctx, cancel := s.ms.callContext(ctx)
	defer cancel()
	err = d.destroy(cctx, ms)
	switch {
	case err == nil:
		s.recorder.Eventf(o, corev1.EventTypeNormal, "Destroyed", "destroyed %s", d.what())
		return nil
	case grpcCode(err) == codes.NotFound:
		return nil
	default:
		// FAILED_PRECONDITION names what the store still holds (containers created outside
		// Kubernetes): it is not forced away.
		return storeErr(err, "%s: destroy", d.what())
	}
}

// accessProps adds to props the store properties of a Pool's or Container's access fields: the
// ACL, owner and group when set, and the namespaces the CSI driver lets use it when any are
// listed (docs/access-control.md).
func accessProps(props map[string]string, acl storagev1.ACL, owner, group storagev1.Principal, allowed storagev1.AllowedNamespaces) {
	if acl != "" {
		props[storagev1.PropACL] = string(acl)
	}
	if owner != "" {
		props[storagev1.PropOwner] = string(owner)
	}
	if group != "" {
		props[storagev1.PropGroup] = string(group)
	}
	if len(allowed) > 0 {
		props[storagev1.PropAllowedNamespaces] = allowed.Property()
	}
}

// propsToSet are the properties of desired whose value in the store (have) differs. The spec owns
// the namespaces property: when desired has none, a restriction the store still holds (the list
// was emptied, or set outside Kubernetes) is lifted by setting it to "*" (any namespace).
// Properties the spec leaves unset otherwise keep the store's value.
func propsToSet(desired, have map[string]string) map[string]string {
	diff := map[string]string{}
	for k, v := range desired {
		if !sameProp(k, v, have[k]) {
			diff[k] = v
		}
	}
	if _, ok := desired[storagev1.PropAllowedNamespaces]; !ok {
		if h := have[storagev1.PropAllowedNamespaces]; h != "" && h != storagev1.AnyNamespace {
			diff[storagev1.PropAllowedNamespaces] = storagev1.AnyNamespace
		}
	}
	return diff
}

// propNames lists the keys of props for an event: "properties acl, owner".
func propNames(props map[string]string) string {
	keys := make([]string, 0, len(props))
	for k := range props {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if len(keys) == 1 {
		return "property " + keys[0]
	}
	return "properties " + strings.Join(keys, ", ")
}

// sameProp reports whether the store's value of property k says what the spec's does: the store
// keeps an ACL re-written (its permissions as rwa, in that order) and owner and group names
// without their @, so an ACL is compared whatever the order of its entries and permissions, and
// a name with or without its @; every other property as text.
func sameProp(k, want, have string) bool {
	switch k {
	case storagev1.PropACL:
		return canonicalACL(want) == canonicalACL(have)
	case storagev1.PropOwner, storagev1.PropGroup:
		return strings.TrimSuffix(want, "@") == strings.TrimSuffix(have, "@")
	}
	return want == have
}

// canonicalACL sorts an ACL's entries and the permissions of each.
func canonicalACL(acl string) string {
	if acl == "" {
		return ""
	}
	entries := strings.Split(acl, ",")
	for i, e := range entries {
		if j := strings.LastIndexByte(e, ':'); j >= 0 {
			perms := []byte(e[j+1:])
			sort.Slice(perms, func(a, b int) bool { return perms[a] < perms[b] })
			entries[i] = e[:j+1] + string(perms)
		}
	}
	sort.Strings(entries)
	return strings.Join(entries, ",")
}
