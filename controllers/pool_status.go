package controllers

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

func tiersTotal(info *mgmtpb.PoolInfo) uint64 {
	var n uint64
	for _, t := range info.Tiers {
		n += t.Total
	}
	return n
}

// copyPoolStatus copies a PoolQuery answer into the status; the Ready condition follows the
// store's state.
func copyPoolStatus(pool *storagev1.Pool, info *mgmtpb.PoolInfo) {
	st := &pool.Status
	st.UUID, st.Label, st.MapVersion = info.Uuid, info.Label, int64(info.MapVersion)
	st.TotalTargets, st.DisabledTargets, st.Containers = int32(info.TotalTargets), int32(info.DisabledTargets), int32(info.Containers)
	st.Ranks = nil
	for _, r := range info.Ranks {
		st.Ranks = append(st.Ranks, int32(r))
	}
	st.Tiers = nil
	var total, free uint64
	for _, t := range info.Tiers {
		st.Tiers = append(st.Tiers, storagev1.TierStatus{Name: t.Name, Total: int64(t.Total), Free: int64(t.Free)})
		total += t.Total
		free += t.Free
		poolBytes.WithLabelValues(pool.Namespace, pool.Name, t.Name, "total").Set(float64(t.Total))
		poolBytes.WithLabelValues(pool.Namespace, pool.Name, t.Name, "free").Set(float64(t.Free))
	}
	st.Size, st.Free = humanBytes(total), humanBytes(free)
	st.State = info.State
	msg := fmt.Sprintf("pool %q (%s) is %s: %d targets (%d disabled), map version %d",
		info.Label, info.Uuid, info.State, info.TotalTargets, info.DisabledTargets, info.MapVersion)
	if info.State == "ready" {
		setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionTrue, "PoolReady", msg)
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionFalse, "AllTargetsUp", msg)
	} else {
		// A degraded pool still serves I/O; Degraded tells why.
		setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionTrue, "PoolServing", msg)
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionTrue, "Pool"+titleWord(info.State), msg)
	}
}

// lostReason is the Ready reason of a Pool or Container whose object the management service no
// longer has (destroyed outside Kubernetes): it is not re-created, and its status keeps only what
// names it.
const lostReason = "NotFoundInManagementService"

// markPoolLost records that the management service no longer has the pool: state "lost", the
// figures the last PoolQuery reported cleared (status comes only from the management service, and
// it has nothing to say about this pool any more), Ready False and Degraded Unknown saying why.
// UUID and label stay: they name what was lost. It returns the conditions' message.
func markPoolLost(pool *storagev1.Pool, label string, err error) string {
	st := &pool.Status
	st.State = "lost"
	st.MapVersion, st.Ranks, st.TotalTargets, st.DisabledTargets, st.Containers = 0, nil, 0, 0, 0
	st.Tiers, st.Size, st.Free = nil, "", ""
	forgetPoolMetrics(pool.Namespace, pool.Name)
	msg := fmt.Sprintf("the management service no longer has pool %q (%s): %s; it was destroyed outside Kubernetes and is not re-created",
		label, st.UUID, grpcMessage(err))
	setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionFalse, lostReason, msg)
	setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionUnknown, lostReason, msg)
	return msg
}

// recordStateChange emits an event when the store's state of the pool changed since the last copy.
func (r *PoolReconciler) recordStateChange(pool, before *storagev1.Pool) {
	if pool.Status.State != "" && pool.Status.State != before.Status.State && before.Status.State != "" {
		kind := corev1.EventTypeNormal
		if pool.Status.State != "ready" {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(pool, kind, "StateChanged", "pool %q: %s -> %s", pool.Status.Label, before.Status.State, pool.Status.State)
	}
}

func setPoolCondition(pool *storagev1.Pool, t string, s metav1.ConditionStatus, reason, msg string) {
	setCondition(&pool.Status.Conditions, pool.Generation, t, s, reason, msg)
}

func titleWord(s string) string {
	if s == "" {
		return "Unknown"
	}
	b := []byte(s)
	if b[0] >= 'a' && b[0] <= 'z' {
		b[0] -= 'a' - 'A'
	}
	return string(b)
}
