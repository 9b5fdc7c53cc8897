package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// reconcileDelete releases a Pool: held while Containers reference it, then the pool is
// destroyed in the store (reclaim policy Delete) or left there (Retain), then the finalizer goes.
func (r *PoolReconciler) reconcileDelete(ctx context.Context, pool, before *storagev1.Pool) (ctrl.Result, error) {
	if !controllerutil.ContainsFinalizer(pool, storagev1.Finalizer) {
		return ctrl.Result{}, nil
	}
	var conts storagev1.ContainerList
	if err := r.List(ctx, &conts, client.InNamespace(pool.Namespace), client.MatchingFields{containerPoolIndex: pool.Name}); err != nil {
		return ctrl.Result{}, err
	}
	if len(conts.Items) > 0 {
		names := make([]string, 0, len(conts.Items))
		for _, c := range conts.Items {
			names = append(names, c.Name)
		}
		sort.Strings(names)
		msg := fmt.Sprintf("deletion waits for %d container(s) that use this pool: %s", len(names), strings.Join(names, ", "))
		if old := findCondition(before.Status.Conditions, storagev1.ConditionDeletionBlocked); old == nil || old.Message != msg {
			r.Recorder.Event(pool, corev1.EventTypeWarning, "DeletionBlocked", msg)
		}
		setPoolCondition(pool, storagev1.ConditionDeletionBlocked, metav1.ConditionTrue, "ContainersExist", msg)
		// Container deletions wake this Pool through the watch; the requeue is a safety net.
		return r.finish(ctx, pool, before, ctrl.Result{RequeueAfter: 30 * time.Second}, nil)
	}

	if pool.Spec.ReclaimPolicy != storagev1.ReclaimRetain && pool.Status.UUID != "" {
		addr, err := serverSetMgmtAddress(ctx, r.Client, pool.Namespace, pool.Spec.ServerSetRef.Name)
		if err != nil {
			// Without its ServerSet there is no store to release the pool from.
			r.Recorder.Eventf(pool, corev1.EventTypeWarning, "PoolNotDestroyed",
				"pool %q (%s) left in the store: %v", poolLabel(pool), pool.Status.UUID, err)
		} else if err := r.destroyPool(ctx, pool, addr); err != nil {
			setPoolCondition(pool, storagev1.ConditionDeletionBlocked, metav1.ConditionTrue, "DestroyFailed", err.Error())
			r.Recorder.Event(pool, corev1.EventTypeWarning, "DestroyFailed", err.Error())
			return r.finish(ctx, pool, before, ctrl.Result{}, err)
		}
	} else if pool.Status.UUID != "" {
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, "Retained", "pool %q (%s) retained in the store", poolLabel(pool), pool.Status.UUID)
	}
	forgetPoolMetrics(pool.Namespace, pool.Name)
	controllerutil.RemoveFinalizer(pool, storagev1.Finalizer)
	return ctrl.Result{}, client.IgnoreNotFound(r.Update(ctx, pool))
}

func (r *PoolReconciler) destroyPool(ctx context.Context, pool *storagev1.Pool, addr string) error {
	ms, err := r.MS.Client(addr)
	if err != nil {
		return err
	}
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	_, err = ms.PoolDestroy(cctx, &mgmtpb.PoolDestroyReq{Id: pool.Status.UUID})
	switch {
	case err == nil:
		r.Recorder.Eventf(pool, corev1.EventTypeNormal, "Destroyed", "destroyed pool %q (%s)", poolLabel(pool), pool.Status.UUID)
		return nil
	case grpcCode(err) == codes.NotFound:
		return nil
	default:
		// FAILED_PRECONDITION names containers created outside Kubernetes: they are not forced away.
		return storeErr(err, "pool %q (%s): destroy", poolLabel(pool), pool.Status.UUID)
	}
}

func findCondition(conds []metav1.Condition, t string) *metav1.Condition {
	for i := range conds {
		if conds[i].Type == t {
			return &conds[i]
		}
	}
	return nil
}
