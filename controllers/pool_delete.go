package controllers

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
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
		if old := meta.FindStatusCondition(before.Status.Conditions, storagev1.ConditionDeletionBlocked); old == nil || old.Message != msg {
			r.Recorder.Event(pool, corev1.EventTypeWarning, "DeletionBlocked", msg)
		}
		setPoolCondition(pool, storagev1.ConditionDeletionBlocked, metav1.ConditionTrue, storagev1.ReasonContainersExist, msg)
		// Container deletions wake this Pool through the watch; the requeue is a safety net.
		return r.store().finish(ctx, pool, before, ctrl.Result{RequeueAfter: 30 * time.Second}, nil)
	}
	return r.store().reconcileDelete(ctx, pool, before, storeDeletion{
		kind: "pool", label: poolLabel(pool), uuid: pool.Status.UUID, reclaim: pool.Spec.ReclaimPolicy,
		address: func(ctx context.Context) (mgmtTarget, error) {
			return serverSetTarget(ctx, r.Client, pool.Namespace, pool.Spec.ServerSetRef.Name)
		},
		destroy: func(ctx context.Context, ms mgmtpb.MgmtClient) error {
			_, err := ms.PoolDestroy(ctx, &mgmtpb.PoolDestroyReq{Id: pool.Status.UUID})
			return err
		},
		forgetMetrics: func() { forgetPoolMetrics(pool.Namespace, pool.Name) },
	})
}
