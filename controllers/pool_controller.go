package controllers

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// PoolReconciler creates (or adopts) a pool through the management service and copies its state.
type PoolReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	MS       *ManagementServices
	// Refresh is how often the status is re-read from the management service (default 30 s).
	Refresh time.Duration
}

// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=pools,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=pools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=pools/finalizers,verbs=update
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=containers,verbs=get;list;watch

// Reconcile drives one Pool.
func (r *PoolReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	pool := &storagev1.Pool{}
	if err := r.Get(ctx, req.NamespacedName, pool); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := pool.DeepCopy()
	s := r.store()
	if !pool.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, pool, before)
	}
	if controllerutil.AddFinalizer(pool, storagev1.Finalizer) {
		if err := r.Update(ctx, pool); err != nil {
			return ctrl.Result{}, err
		}
		before = pool.DeepCopy()
	}

	target, err := serverSetTarget(ctx, r.Client, pool.Namespace, pool.Spec.ServerSetRef.Name)
	if err != nil {
		setReady(pool, metav1.ConditionFalse, storagev1.ReasonServerSetNotFound, err.Error())
		return s.finish(ctx, pool, before, ctrl.Result{RequeueAfter: 10 * time.Second}, nil)
	}
	if pool.Status.UUID == "" {
		if why := r.enginesNotJoined(ctx, pool); why != "" {
			setReady(pool, metav1.ConditionFalse, storagev1.ReasonWaitingForEngines, why)
			return s.finish(ctx, pool, before, ctrl.Result{RequeueAfter: 5 * time.Second}, nil)
		}
	}
	ms, err := r.MS.Client(target)
	if err != nil {
		return s.finish(ctx, pool, before, ctrl.Result{}, err)
	}
	info, err := r.ensurePool(ctx, pool, ms)
	if err != nil {
		return s.callFailed(ctx, pool, before, err)
	}
	if info != nil {
		copyPoolStatus(pool, info)
		r.recordStateChange(pool, before)
	}
	return s.finish(ctx, pool, before, s.requeue(), nil)
}

func (r *PoolReconciler) store() storeReconciler {
	return storeReconciler{Client: r.Client, recorder: r.Recorder, ms: r.MS, refresh: r.Refresh}
}

func poolLabel(p *storagev1.Pool) string {
	if p.Spec.Label != "" {
		return p.Spec.Label
	}
	return p.Name
}

// ensurePool finds the pool in the store (by the UUID it recorded, else by label: adoption) or
// creates it, then brings its mutable properties to the spec. It returns nil info (and no error)
// when the recorded pool has vanished from the store; the Ready condition says so.
func (r *PoolReconciler) ensurePool(ctx context.Context, pool *storagev1.Pool, ms mgmtpb.MgmtClient) (*mgmtpb.PoolInfo, error) {
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	label := poolLabel(pool)
	if pool.Status.UUID != "" {
		info, err := ms.PoolQuery(cctx, &mgmtpb.PoolQueryReq{Id: pool.Status.UUID})
		if grpcCode(err) == codes.NotFound {
			wasLost := pool.Status.State == storagev1.PoolStateLost
			if msg := markPoolLost(pool, label, err); !wasLost {
				r.Recorder.Event(pool, corev1.EventTypeWarning, "PoolLost", msg)
			}
			return nil, nil
		}
		if err != nil {
			return nil, storeErr(err, "pool %q: query", label)
		}
		return r.syncProps(cctx, pool, ms, info)
	}
	info, err := ms.PoolQuery(cctx, &mgmtpb.PoolQueryReq{Id: label})
	switch {
	case err == nil:
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, "Adopted", "adopted existing pool %q (%s)", label, info.Uuid)
	case grpcCode(err) == codes.NotFound:
		req, berr := poolCreateReq(pool, label)
		if berr != nil {
			return nil, berr
		}
		info, err = ms.PoolCreate(cctx, req)
		if err != nil {
			return nil, storeErr(err, "pool %q: create", label)
		}
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, "Created", "created pool %q (%s), %s", label, info.Uuid, humanBytes(tiersTotal(info)))
	default:
		return nil, storeErr(err, "pool %q: query", label)
	}
	pool.Status.UUID = info.Uuid
	return r.syncProps(cctx, pool, ms, info)
}

func poolCreateReq(pool *storagev1.Pool, label string) (*mgmtpb.PoolCreateReq, error) {
	req := &mgmtpb.PoolCreateReq{Label: label, Props: desiredPoolProps(pool)}
	var err error
	if pool.Spec.Size != "" {
		if req.TotalSize, err = pool.Spec.Size.Bytes(); err != nil {
			return nil, storeErr(err, "pool %q: spec.size", label)
		}
		if pool.Spec.TierRatio != "" {
			if req.TierRatio, err = strconv.ParseFloat(pool.Spec.TierRatio, 64); err != nil {
				return nil, storeErr(err, "pool %q: spec.tierRatio", label)
			}
		}
	} else {
		if req.ScmSize, err = pool.Spec.ScmSize.Bytes(); err != nil {
			return nil, storeErr(err, "pool %q: spec.scmSize", label)
		}
		if req.NvmeSize, err = pool.Spec.NvmeSize.Bytes(); err != nil {
			return nil, storeErr(err, "pool %q: spec.nvmeSize", label)
		}
	}
	return req, nil
}

// desiredPoolProps are the store properties the spec sets.
func desiredPoolProps(pool *storagev1.Pool) map[string]string {
	props := map[string]string{}
	for k, v := range pool.Spec.Properties {
		props[k] = v
	}
	if pool.Spec.RedundancyFactor != nil {
		props["rf"] = strconv.Itoa(int(*pool.Spec.RedundancyFactor))
	}
	accessProps(props, pool.Spec.ACL, pool.Spec.Owner, pool.Spec.Group, pool.Spec.AllowedNamespaces)
	return props
}

// syncProps sets the properties whose value in the store differs from the spec.
func (r *PoolReconciler) syncProps(ctx context.Context, pool *storagev1.Pool, ms mgmtpb.MgmtClient, info *mgmtpb.PoolInfo) (*mgmtpb.PoolInfo, error) {
	diff := propsToSet(desiredPoolProps(pool), info.Props)
	if len(diff) == 0 {
		return info, nil
	}
	updated, err := ms.PoolSetProp(ctx, &mgmtpb.PoolSetPropReq{Id: info.Uuid, Props: diff})
	if err != nil {
		return nil, storeErr(err, "pool %q: set properties", info.Label)
	}
	r.Recorder.Eventf(pool, corev1.EventTypeNormal, "PropertiesSet", "set %s of pool %q", propNames(diff), info.Label)
	return updated, nil
}

// enginesNotJoined says why a pool is not created yet ("" when it may be): the store places a new
// pool on the engines joined at that moment, for the pool's life, so it waits until the ServerSet
// reports every engine joined (Ready). Right after a first format the engines rejoin one by one;
// a pool made then would span fewer engines than the ServerSet has.
func (r *PoolReconciler) enginesNotJoined(ctx context.Context, pool *storagev1.Pool) string {
	ss := &storagev1.ServerSet{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: pool.Namespace, Name: pool.Spec.ServerSetRef.Name}, ss); err != nil {
		return fmt.Sprintf("serverset %q: %v", pool.Spec.ServerSetRef.Name, err)
	}
	if c := meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionReady); c == nil || c.Status != metav1.ConditionTrue {
		msg := "not reported yet"
		if c != nil {
			msg = c.Message
		}
		return fmt.Sprintf("waiting for every engine of serverset %q to join before creating the pool (a pool spans the engines joined when it is made): %s", ss.Name, msg)
	}
	return ""
}

// serverSetTarget finds the management service of a ServerSet: its address from the status when
// the ServerSet controller has published it, else the address derived from the ServerSet.
func serverSetTarget(ctx context.Context, c client.Client, ns, name string) (mgmtTarget, error) {
	ss := &storagev1.ServerSet{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, ss); err != nil {
		if apierrors.IsNotFound(err) {
			return mgmtTarget{}, fmt.Errorf("serverset %q not found", name)
		}
		return mgmtTarget{}, err
	}
	if ss.Status.MgmtAddress != "" {
		return targetOf(ss, ss.Status.MgmtAddress), nil
	}
	return targetOf(ss, mgmtAddress(ss)), nil
}

// SetupWithManager registers the reconciler; a Container's changes wake its Pool (deletion
// waits for them), and a ServerSet's wake the Pools that use it.
func (r *PoolReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&storagev1.Pool{}).
		Watches(&storagev1.Container{}, handler.EnqueueRequestsFromMapFunc(func(_ context.Context, o client.Object) []reconcile.Request {
			c := o.(*storagev1.Container)
			return []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Spec.PoolRef.Name}}}
		})).
		Watches(&storagev1.ServerSet{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var pools storagev1.PoolList
			if err := r.List(ctx, &pools, client.InNamespace(o.GetNamespace()), client.MatchingFields{poolServerSetIndex: o.GetName()}); err != nil {
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(pools.Items))
			for _, p := range pools.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: p.Namespace, Name: p.Name}})
			}
			return reqs
		})).
		Named("pool").
		Complete(r)
}

// SetupIndexes registers the field indexes the reconcilers list by; call it before SetupWithManager.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager) error {
	if err := mgr.GetFieldIndexer().IndexField(ctx, &storagev1.Container{}, containerPoolIndex,
		func(o client.Object) []string { return []string{o.(*storagev1.Container).Spec.PoolRef.Name} }); err != nil {
		return err
	}
	if err := mgr.GetFieldIndexer().IndexField(ctx, &storagev1.Pool{}, poolServerSetIndex,
		func(o client.Object) []string { return []string{o.(*storagev1.Pool).Spec.ServerSetRef.Name} }); err != nil {
		return err
	}
	return nil
}

const (
	containerPoolIndex = "spec.poolRef.name"
	poolServerSetIndex = "spec.serverSetRef.name"
)
