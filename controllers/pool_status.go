package controllers

import (
	"fmt"
	"slices"
	"sort"
	"strings"

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
// store's state. Degraded is True while targets are not up-and-in: TargetsDown when some are
// excluded (disabled), TargetsReintegrating when the only ones out are back and being brought up
// to date; its message names the ranks and their state.
func copyPoolStatus(pool *storagev1.Pool, info *mgmtpb.PoolInfo) {
	st := &pool.Status
	st.UUID, st.Label, st.MapVersion = info.Uuid, info.Label, int64(info.MapVersion)
	setPoolInfo(pool.Namespace, pool.Name, info.Uuid, info.Label)
	st.TotalTargets, st.DisabledTargets, st.Containers = int32(info.TotalTargets), int32(info.DisabledTargets), int32(info.Containers)
	st.ReintegratingTargets = int32(info.ReintegratingTargets)
	st.Ranks = nil
	for _, r := range info.Ranks {
		st.Ranks = append(st.Ranks, int32(r))
	}
	st.RanksOut = ranksOut(info.RankStates)
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
	st.State = storagev1.PoolState(info.State.Word())
	msg := fmt.Sprintf("pool %q (%s) is %s: %d targets (%d disabled, %d reintegrating), map version %d",
		info.Label, info.Uuid, st.State, info.TotalTargets, info.DisabledTargets, info.ReintegratingTargets, info.MapVersion)
	if len(st.RanksOut) > 0 {
		var ranks []string
		for _, r := range st.RanksOut {
			ranks = append(ranks, fmt.Sprintf("rank %d %s", r.Rank, targetStateWords(r.State)))
		}
		msg += "; targets not up-and-in: " + strings.Join(ranks, ", ")
	}
	switch {
	case info.State == mgmtpb.PoolState_POOL_STATE_READY && info.DisabledTargets == 0 && info.ReintegratingTargets == 0 && len(st.RanksOut) == 0:
		setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionTrue, storagev1.ReasonPoolReady, msg)
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionFalse, storagev1.ReasonAllTargetsUp, msg)
		return
	case info.DisabledTargets > 0 || hasRankState(st.RanksOut, storagev1.TargetDown, storagev1.TargetDownOut):
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonTargetsDown, msg)
	case info.ReintegratingTargets > 0 || info.State == mgmtpb.PoolState_POOL_STATE_REINTEGRATING || hasRankState(st.RanksOut, storagev1.TargetReintegrating):
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonTargetsReintegrating, msg)
	case info.State == mgmtpb.PoolState_POOL_STATE_DEGRADED:
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonPoolDegraded, msg)
	default:
		setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonPoolUnknown, msg)
	}
	// A degraded or reintegrating pool still serves I/O; Degraded tells why.
	setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionTrue, storagev1.ReasonPoolServing, msg)
}

// ranksOut is the pool map's ranks whose targets are not up-and-in, one entry per rank (the
// status lists them by rank), sorted. Should the service name a rank twice, the entry keeps the
// worse state: down-and-out over down over reintegrating.
func ranksOut(states []*mgmtpb.RankTargetState) []storagev1.RankTargetState {
	severity := map[storagev1.TargetState]int{storagev1.TargetReintegrating: 1, storagev1.TargetDown: 2, storagev1.TargetDownOut: 3}
	byRank := map[int32]storagev1.TargetState{}
	for _, rs := range states {
		var s storagev1.TargetState
		switch rs.State {
		case mgmtpb.TargetState_TARGET_UP_IN:
			continue
		case mgmtpb.TargetState_TARGET_UP:
			s = storagev1.TargetReintegrating
		case mgmtpb.TargetState_TARGET_DOWN_OUT:
			s = storagev1.TargetDownOut
		default:
			// TARGET_DOWN, or a state this operator does not know yet: not up-and-in.
			s = storagev1.TargetDown
		}
		if old, ok := byRank[int32(rs.Rank)]; !ok || severity[s] > severity[old] {
			byRank[int32(rs.Rank)] = s
		}
	}
	var out []storagev1.RankTargetState
	for r, s := range byRank {
		out = append(out, storagev1.RankTargetState{Rank: r, State: s})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Rank < out[j].Rank })
	return out
}

// targetStateWords is how a condition message says a rank's target state.
func targetStateWords(s storagev1.TargetState) string {
	switch s {
	case storagev1.TargetDown:
		return "down"
	case storagev1.TargetReintegrating:
		return "reintegrating"
	case storagev1.TargetDownOut:
		return "down and out"
	}
	return string(s)
}

func hasRankState(ranks []storagev1.RankTargetState, states ...storagev1.TargetState) bool {
	for _, r := range ranks {
		if slices.Contains(states, r.State) {
			return true
		}
	}
	return false
}

// markPoolLost records that the management service no longer has the pool: state "lost", the
// figures the last PoolQuery reported cleared (status comes only from the management service, and
// it has nothing to say about this pool any more), Ready False and Degraded Unknown saying why.
// UUID and label stay: they name what was lost. It returns the conditions' message.
func markPoolLost(pool *storagev1.Pool, label string, err error) string {
	st := &pool.Status
	st.State = storagev1.PoolStateLost
	st.MapVersion, st.Ranks, st.TotalTargets, st.DisabledTargets, st.Containers = 0, nil, 0, 0, 0
	st.ReintegratingTargets, st.RanksOut = 0, nil
	st.Tiers, st.Size, st.Free = nil, "", ""
	forgetPoolMetrics(pool.Namespace, pool.Name)
	msg := fmt.Sprintf("the management service no longer has pool %q (%s): %s; it was destroyed outside Kubernetes and is not re-created",
		label, st.UUID, grpcMessage(err))
	setPoolCondition(pool, storagev1.ConditionReady, metav1.ConditionFalse, storagev1.ReasonNotFoundInManagementService, msg)
	setPoolCondition(pool, storagev1.ConditionDegraded, metav1.ConditionUnknown, storagev1.ReasonNotFoundInManagementService, msg)
	return msg
}

// recordStateChange emits an event when the store's state of the pool changed since the last copy.
func (r *PoolReconciler) recordStateChange(pool, before *storagev1.Pool) {
	if pool.Status.State != "" && pool.Status.State != before.Status.State && before.Status.State != "" {
		kind := corev1.EventTypeNormal
		if pool.Status.State != storagev1.PoolStateReady {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Eventf(pool, kind, "StateChanged", "pool %q: %s -> %s", pool.Status.Label, before.Status.State, pool.Status.State)
	}
}

func setPoolCondition(pool *storagev1.Pool, t string, s metav1.ConditionStatus, reason storagev1.ConditionReason, msg string) {
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
