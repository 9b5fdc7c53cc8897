package controllers

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
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

// ContainerReconciler creates (or adopts) a container in its pool and copies its state.
type ContainerReconciler struct {
	client.Client
	Scheme   *runtime.Scheme
	Recorder record.EventRecorder
	MS       *ManagementServices
	// Refresh is how often the status is re-read from the management service (default 30 s).
	Refresh time.Duration
}

// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=containers,verbs=get;list;watch;update;patch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=containers/status,verbs=get;update;patch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=containers/finalizers,verbs=update
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=pools,verbs=get;list;watch
// +kubebuilder:rbac:groups=storage.peregrine.dev,resources=serversets,verbs=get;list;watch

// Reconcile drives one Container.
func (r *ContainerReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	cont := &storagev1.Container{}
	if err := r.Get(ctx, req.NamespacedName, cont); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	before := cont.DeepCopy()
	s := r.store()
	if !cont.DeletionTimestamp.IsZero() {
		return r.reconcileDelete(ctx, cont, before)
	}
	if controllerutil.AddFinalizer(cont, storagev1.Finalizer) {
		if err := r.Update(ctx, cont); err != nil {
			return ctrl.Result{}, err
		}
		before = cont.DeepCopy()
	}

	pool, target, why := r.resolvePool(ctx, cont)
	if why != "" {
		setReady(cont, metav1.ConditionFalse, storagev1.ReasonPoolNotReady, why)
		return s.finish(ctx, cont, before, ctrl.Result{RequeueAfter: 5 * time.Second}, nil)
	}
	ms, err := r.MS.Client(target)
	if err != nil {
		return s.finish(ctx, cont, before, ctrl.Result{}, err)
	}
	info, err := r.ensureContainer(ctx, cont, pool, ms)
	if err != nil {
		return s.callFailed(ctx, cont, before, err)
	}
	if info != nil {
		copyContainerStatus(cont, pool, info)
	}
	if cont.Status.State != before.Status.State && before.Status.State != "" {
		r.Recorder.Eventf(cont, corev1.EventTypeNormal, "StateChanged", "container %q: %s -> %s", containerLabel(cont), before.Status.State, cont.Status.State)
	}
	return s.finish(ctx, cont, before, s.requeue(), nil)
}

func (r *ContainerReconciler) store() storeReconciler {
	return storeReconciler{Client: r.Client, recorder: r.Recorder, ms: r.MS, refresh: r.Refresh}
}

func containerLabel(c *storagev1.Container) string {
	if c.Spec.Label != "" {
		return c.Spec.Label
	}
	return c.Name
}

// resolvePool returns the container's Pool and its management service, or why it cannot yet.
func (r *ContainerReconciler) resolvePool(ctx context.Context, cont *storagev1.Container) (*storagev1.Pool, mgmtTarget, string) {
	pool := &storagev1.Pool{}
	if err := r.Get(ctx, types.NamespacedName{Namespace: cont.Namespace, Name: cont.Spec.PoolRef.Name}, pool); err != nil {
		return nil, mgmtTarget{}, fmt.Sprintf("pool %q: %v", cont.Spec.PoolRef.Name, err)
	}
	if pool.Status.UUID == "" {
		return nil, mgmtTarget{}, fmt.Sprintf("pool %q has no pool in the store yet", pool.Name)
	}
	if !pool.DeletionTimestamp.IsZero() && cont.Status.UUID == "" {
		return nil, mgmtTarget{}, fmt.Sprintf("pool %q is being deleted", pool.Name)
	}
	target, err := serverSetTarget(ctx, r.Client, pool.Namespace, pool.Spec.ServerSetRef.Name)
	if err != nil {
		return nil, mgmtTarget{}, fmt.Sprintf("pool %q: %v", pool.Name, err)
	}
	return pool, target, ""
}

// ensureContainer finds the container (by recorded UUID, else by label: adoption) or creates it.
// It returns nil info without error when the recorded container vanished from the store.
func (r *ContainerReconciler) ensureContainer(ctx context.Context, cont *storagev1.Container, pool *storagev1.Pool, ms mgmtpb.MgmtClient) (*mgmtpb.ContInfo, error) {
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	label := containerLabel(cont)
	if cont.Status.UUID != "" {
		info, err := ms.ContQuery(cctx, &mgmtpb.ContQueryReq{Pool: pool.Status.UUID, Id: cont.Status.UUID})
		if grpcCode(err) == codes.NotFound {
			wasLost := cont.Status.State == storagev1.ContainerStateLost
			if msg := markContainerLost(cont, pool, label, err); !wasLost {
				r.Recorder.Event(cont, corev1.EventTypeWarning, "ContainerLost", msg)
			}
			return nil, nil
		}
		if err != nil {
			return nil, storeErr(err, "container %q: query", label)
		}
		return r.syncProps(cctx, cont, ms, info)
	}
	info, err := ms.ContQuery(cctx, &mgmtpb.ContQueryReq{Pool: pool.Status.UUID, Id: label})
	switch {
	case err == nil:
		r.Recorder.Eventf(cont, corev1.EventTypeNormal, "Adopted", "adopted existing container %q (%s) in pool %q", label, info.Uuid, pool.Status.Label)
	case grpcCode(err) == codes.NotFound:
		req := &mgmtpb.ContCreateReq{
			Pool: pool.Status.UUID, Label: label, Type: cont.Spec.Type,
			Oclass: string(cont.Spec.ObjectClass), DirOclass: string(cont.Spec.DirObjectClass), Checksum: cont.Spec.Checksum,
		}
		if cont.Spec.ChunkSize != "" {
			if req.ChunkSize, err = cont.Spec.ChunkSize.Bytes(); err != nil {
				return nil, fmt.Errorf("container %q: spec.chunkSize: %w", label, err)
			}
		}
		if cont.Spec.RedundancyFactor != nil {
			req.RedundancyFactor = uint32(*cont.Spec.RedundancyFactor)
		}
		req.Props = desiredContainerProps(cont)
		if cont.Spec.Sync != "" {
			req.Props["sync"] = cont.Spec.Sync
		}
		if info, err = ms.ContCreate(cctx, req); err != nil {
			return nil, storeErr(err, "container %q in pool %q: create", label, pool.Status.Label)
		}
		r.Recorder.Eventf(cont, corev1.EventTypeNormal, "Created", "created container %q (%s) in pool %q", label, info.Uuid, pool.Status.Label)
	default:
		return nil, storeErr(err, "container %q: query", label)
	}
	cont.Status.UUID = info.Uuid
	return r.syncProps(cctx, cont, ms, info)
}

// desiredContainerProps are the mutable store properties the spec sets (sync, immutable, is set
// at creation only).
func desiredContainerProps(cont *storagev1.Container) map[string]string {
	props := map[string]string{}
	accessProps(props, cont.Spec.ACL, cont.Spec.Owner, cont.Spec.Group, cont.Spec.AllowedNamespaces)
	return props
}

// syncProps sets the properties whose value in the store differs from the spec.
func (r *ContainerReconciler) syncProps(ctx context.Context, cont *storagev1.Container, ms mgmtpb.MgmtClient, info *mgmtpb.ContInfo) (*mgmtpb.ContInfo, error) {
	diff := propsToSet(desiredContainerProps(cont), info.Props)
	if len(diff) == 0 {
		return info, nil
	}
	updated, err := ms.ContSetProp(ctx, &mgmtpb.ContSetPropReq{Pool: info.PoolUuid, Id: info.Uuid, Props: diff})
	if err != nil {
		return nil, storeErr(err, "container %q: set properties", info.Label)
	}
	r.Recorder.Eventf(cont, corev1.EventTypeNormal, "PropertiesSet", "set %s of container %q", propNames(diff), info.Label)
	return updated, nil
}

func copyContainerStatus(cont *storagev1.Container, pool *storagev1.Pool, info *mgmtpb.ContInfo) {
	st := &cont.Status
	st.UUID, st.PoolUUID, st.State = info.Uuid, info.PoolUuid, storagev1.ContainerStateReady
	st.ObjectClass, st.RedundancyFactor = info.Oclass, int32(info.RedundancyFactor)
	st.UsedBytes, st.Used, st.Snapshots = int64(info.UsedBytes), humanBytes(info.UsedBytes), int32(info.Snapshots)
	containerUsedBytes.WithLabelValues(cont.Namespace, pool.Name, cont.Name).Set(float64(info.UsedBytes))
	setCondition(&st.Conditions, cont.Generation, storagev1.ConditionReady, metav1.ConditionTrue, storagev1.ReasonContainerReady,
		fmt.Sprintf("container %q (%s) in pool %q: type %s, object class %s, rf %d, chunk %s",
			info.Label, info.Uuid, pool.Status.Label, info.Type.Word(), info.Oclass, info.RedundancyFactor, humanBytes(info.ChunkSize)))
}

// markContainerLost records that the management service no longer has the container (it, or its
// pool, was destroyed outside Kubernetes): state "lost", the figures the last ContQuery reported
// cleared, Ready False saying why. UUID and pool UUID stay: they name what was lost. It returns
// the condition's message.
func markContainerLost(cont *storagev1.Container, pool *storagev1.Pool, label string, err error) string {
	st := &cont.Status
	st.State = storagev1.ContainerStateLost
	st.ObjectClass, st.RedundancyFactor = "", 0
	st.UsedBytes, st.Used, st.Snapshots = 0, "", 0
	forgetContainerMetrics(cont.Namespace, cont.Name)
	msg := fmt.Sprintf("the management service no longer has container %q (%s) in pool %q: %s; it was destroyed outside Kubernetes and is not re-created",
		label, st.UUID, pool.Status.Label, grpcMessage(err))
	setCondition(&st.Conditions, cont.Generation, storagev1.ConditionReady, metav1.ConditionFalse, storagev1.ReasonNotFoundInManagementService, msg)
	return msg
}

// reconcileDelete destroys the container in the store (reclaim policy Delete) or leaves it
// (Retain), then lets the object go; its Pool, which waits for it, is woken by the watch.
func (r *ContainerReconciler) reconcileDelete(ctx context.Context, cont, before *storagev1.Container) (ctrl.Result, error) {
	return r.store().reconcileDelete(ctx, cont, before, storeDeletion{
		kind: "container", label: containerLabel(cont), uuid: cont.Status.UUID, reclaim: cont.Spec.ReclaimPolicy,
		address: func(ctx context.Context) (mgmtTarget, error) {
			pool := &storagev1.Pool{}
			if err := r.Get(ctx, types.NamespacedName{Namespace: cont.Namespace, Name: cont.Spec.PoolRef.Name}, pool); err != nil {
				return mgmtTarget{}, err
			}
			return serverSetTarget(ctx, r.Client, pool.Namespace, pool.Spec.ServerSetRef.Name)
		},
		destroy: func(ctx context.Context, ms mgmtpb.MgmtClient) error {
			_, err := ms.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: cont.Status.PoolUUID, Id: cont.Status.UUID})
			return err
		},
		forgetMetrics: func() { forgetContainerMetrics(cont.Namespace, cont.Name) },
	})
}

// SetupWithManager registers the reconciler; a Pool's changes wake its Containers.
func (r *ContainerReconciler) SetupWithManager(mgr ctrl.Manager) error {
	return ctrl.NewControllerManagedBy(mgr).
		For(&storagev1.Container{}).
		Watches(&storagev1.Pool{}, handler.EnqueueRequestsFromMapFunc(func(ctx context.Context, o client.Object) []reconcile.Request {
			var conts storagev1.ContainerList
			if err := r.List(ctx, &conts, client.InNamespace(o.GetNamespace()), client.MatchingFields{containerPoolIndex: o.GetName()}); err != nil {
				return nil
			}
			reqs := make([]reconcile.Request, 0, len(conts.Items))
			for _, c := range conts.Items {
				reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: c.Namespace, Name: c.Name}})
			}
			return reqs
		})).
		Named("container").
		Complete(r)
}
