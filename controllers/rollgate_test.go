package controllers

// Plain Go tests of the pure decisions around targets that are not up-and-in: they need neither
// the API server nor an engine, so `go test ./controllers -run 'TestRollGate|TestTargetsOut'`
// runs them on their own (the envtest suite, TestControllers, needs KUBEBUILDER_ASSETS).

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

func joined(rank, out uint32) *mgmtpb.Member {
	return &mgmtpb.Member{Rank: rank, State: mgmtpb.MemberState_MEMBER_STATE_JOINED, Targets: 2, TargetsOut: out}
}

func TestRollGate(t *testing.T) {
	for _, tc := range []struct {
		name     string
		members  []*mgmtpb.Member
		replicas int32
		ready    bool
		// want: substrings of the message, in this order; notWant: substrings it must not hold.
		want    []string
		notWant []string
	}{
		{name: "every rank joined, every target up and in", replicas: 3,
			members: []*mgmtpb.Member{joined(0, 0), joined(1, 0), joined(2, 0)},
			ready:   true, want: []string{"all 3 ranks joined"}},
		{name: "the restarted engine joined but is still reintegrating", replicas: 3,
			members: []*mgmtpb.Member{joined(0, 0), joined(1, 0), joined(2, 1)},
			want:    []string{"rank 2: 1 target(s) not up-and-in in its pools"}, notWant: []string{"rank 0", "rank 1"}},
		{name: "enough ranks joined is not enough: one has targets out", replicas: 2,
			members: []*mgmtpb.Member{joined(0, 2), joined(1, 0)},
			want:    []string{"rank 0: 2 target(s) not up-and-in in its pools"}},
		{name: "a stopped rank, its targets down", replicas: 3,
			members: []*mgmtpb.Member{joined(0, 0), {Rank: 1, State: mgmtpb.MemberState_MEMBER_STATE_STOPPED, TargetsOut: 2}, joined(2, 0)},
			want:    []string{"rank 1: stopped, 2 target(s) not up-and-in in its pools"}},
		{name: "a stopped rank the service has not excluded yet", replicas: 2,
			members: []*mgmtpb.Member{joined(0, 0), {Rank: 1, State: mgmtpb.MemberState_MEMBER_STATE_STOPPED}},
			want:    []string{"rank 1: stopped"}, notWant: []string{"target(s)"}},
		{name: "a rank that never joined", replicas: 3,
			members: []*mgmtpb.Member{joined(0, 0), joined(2, 0)},
			want:    []string{"rank 1: not a member of the system"}},
		{name: "a rank in maintenance", replicas: 2,
			members: []*mgmtpb.Member{joined(0, 0), {Rank: 1, State: mgmtpb.MemberState_MEMBER_STATE_MAINTENANCE}},
			want:    []string{"rank 1: maintenance"}},
		{name: "every rank held back is named, by rank", replicas: 4,
			members: []*mgmtpb.Member{joined(3, 1), {Rank: 1, State: mgmtpb.MemberState_MEMBER_STATE_STOPPED, TargetsOut: 2}, joined(0, 0)},
			want: []string{"rank 1: stopped, 2 target(s)", "; rank 2: not a member of the system",
				"; rank 3: 1 target(s) not up-and-in"}},
		{name: "a member beyond the replicas counts too", replicas: 1,
			members: []*mgmtpb.Member{joined(0, 0), joined(1, 2)},
			want:    []string{"rank 1: 2 target(s) not up-and-in"}},
		{name: "no member yet", replicas: 1,
			want: []string{"rank 0: not a member of the system"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ready, msg := rollGate(tc.members, tc.replicas)
			if ready != tc.ready {
				t.Fatalf("rollGate ready = %v, want %v (message %q)", ready, tc.ready, msg)
			}
			rest := msg
			for _, w := range tc.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("message %q: want %q (in order)", msg, w)
				}
				rest = rest[i+len(w):]
			}
			for _, w := range tc.notWant {
				if strings.Contains(msg, w) {
					t.Fatalf("message %q must not contain %q", msg, w)
				}
			}
		})
	}
}

// The partition steps down only with the gate open, and a roll held by the gate says so.
func TestRollGateHoldsThePartition(t *testing.T) {
	s := rollState{replicas: 3, partition: 2, previousHash: "b", desiredHash: "b", updated: 1, ready: 3, observed: true}
	s.systemHealthy, s.systemMessage = rollGate([]*mgmtpb.Member{joined(0, 0), joined(1, 0), joined(2, 2)}, 3)
	if got := nextPartition(s); got != 2 {
		t.Fatalf("partition %d while rank 2 reintegrates, want 2", got)
	}
	if !s.waitingForSystem() {
		t.Fatalf("pods rolled and the gate closed: the roll waits for the system")
	}
	ss := &storagev1.ServerSet{}
	ss.Spec.Engines = 3
	(&ServerSetReconciler{}).setConditions(ss, nil, 3, s.systemMessage, nil)
	c := meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionProgressing)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(storagev1.ReasonWaitingForSystem) ||
		!strings.Contains(c.Message, "rank 2: 2 target(s) not up-and-in in its pools") {
		t.Fatalf("Progressing = %+v", c)
	}

	s.systemHealthy, s.systemMessage = rollGate([]*mgmtpb.Member{joined(0, 0), joined(1, 0), joined(2, 0)}, 3)
	if got := nextPartition(s); got != 1 {
		t.Fatalf("partition %d once rank 2 is reintegrated, want 1", got)
	}
	if s.waitingForSystem() {
		t.Fatalf("gate open: the roll does not wait")
	}

	s.ready, s.systemHealthy = 2, false
	if s.waitingForSystem() {
		t.Fatalf("a pod not ready holds the roll, not the system")
	}
}

func TestTargetsOutServerSetStatus(t *testing.T) {
	ss := &storagev1.ServerSet{}
	ss.Spec.Engines = 3
	sys := &mgmtpb.SystemQueryResp{System: "s", Members: []*mgmtpb.Member{joined(0, 0), joined(1, 1), joined(2, 2)}}
	scan := &mgmtpb.StorageScanResp{}
	r := &ServerSetReconciler{}
	copySystemStatus(ss, sys, scan)
	if ss.Status.EnginesWithTargetsOut != 2 || ss.Status.Engines[1].TargetsOut != 1 || ss.Status.Engines[2].TargetsOut != 2 {
		t.Fatalf("status %+v", ss.Status)
	}
	r.setConditions(ss, nil, 3, "", nil)
	c := meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionDegraded)
	if c == nil || c.Status != metav1.ConditionTrue || c.Reason != string(storagev1.ReasonTargetsReintegrating) ||
		!strings.Contains(c.Message, "rank 1: 1 target(s) not up-and-in in its pools, rank 2: 2 target(s)") {
		t.Fatalf("Degraded = %+v", c)
	}

	sys.Members[2].State = mgmtpb.MemberState_MEMBER_STATE_STOPPED
	copySystemStatus(ss, sys, scan)
	r.setConditions(ss, nil, 3, "", nil)
	c = meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionDegraded)
	if c == nil || c.Reason != "EnginesDown" || !strings.HasPrefix(c.Message, "rank 2 stopped; rank 1: 1 target(s)") {
		t.Fatalf("Degraded = %+v", c)
	}

	sys.Members[1].TargetsOut, sys.Members[2].TargetsOut, sys.Members[2].State = 0, 0, mgmtpb.MemberState_MEMBER_STATE_JOINED
	copySystemStatus(ss, sys, scan)
	r.setConditions(ss, nil, 3, "", nil)
	if ss.Status.EnginesWithTargetsOut != 0 || !meta.IsStatusConditionFalse(ss.Status.Conditions, storagev1.ConditionDegraded) {
		t.Fatalf("status %+v", ss.Status)
	}
}

func TestTargetsOutPoolStatus(t *testing.T) {
	pool := &storagev1.Pool{}
	pool.Name, pool.Namespace = "p", "unit"
	defer forgetPoolMetrics("unit", "p")
	info := &mgmtpb.PoolInfo{Uuid: "u", Label: "p", State: mgmtpb.PoolState_POOL_STATE_DEGRADED, MapVersion: 3, Ranks: []uint32{0, 1, 2},
		TotalTargets: 6, DisabledTargets: 2, ReintegratingTargets: 2,
		RankStates: []*mgmtpb.RankTargetState{
			{Rank: 2, State: mgmtpb.TargetState_TARGET_DOWN},
			{Rank: 1, State: mgmtpb.TargetState_TARGET_UP},
			{Rank: 0, State: mgmtpb.TargetState_TARGET_UP_IN},
		}}
	check := func(reason string, status metav1.ConditionStatus, msg string) {
		t.Helper()
		c := meta.FindStatusCondition(pool.Status.Conditions, storagev1.ConditionDegraded)
		if c == nil || c.Reason != reason || c.Status != status || !strings.Contains(c.Message, msg) {
			t.Fatalf("Degraded = %+v, want %s %s %q", c, status, reason, msg)
		}
		if !meta.IsStatusConditionTrue(pool.Status.Conditions, storagev1.ConditionReady) {
			t.Fatalf("a pool with targets out still serves: Ready %+v", pool.Status.Conditions)
		}
	}

	copyPoolStatus(pool, info)
	if pool.Status.DisabledTargets != 2 || pool.Status.ReintegratingTargets != 2 {
		t.Fatalf("status %+v", pool.Status)
	}
	want := []storagev1.RankTargetState{{Rank: 1, State: storagev1.TargetReintegrating}, {Rank: 2, State: storagev1.TargetDown}}
	if len(pool.Status.RanksOut) != 2 || pool.Status.RanksOut[0] != want[0] || pool.Status.RanksOut[1] != want[1] {
		t.Fatalf("ranksOut %+v, want %+v", pool.Status.RanksOut, want)
	}
	check(string(storagev1.ReasonTargetsDown), metav1.ConditionTrue, "rank 1 reintegrating, rank 2 down")

	info.State, info.DisabledTargets = mgmtpb.PoolState_POOL_STATE_REINTEGRATING, 0
	info.RankStates = info.RankStates[1:]
	copyPoolStatus(pool, info)
	check(string(storagev1.ReasonTargetsReintegrating), metav1.ConditionTrue, "6 targets (0 disabled, 2 reintegrating)")

	info.State, info.ReintegratingTargets, info.RankStates = mgmtpb.PoolState_POOL_STATE_READY, 0, nil
	copyPoolStatus(pool, info)
	check("AllTargetsUp", metav1.ConditionFalse, "is ready")
	if pool.Status.RanksOut != nil || pool.Status.ReintegratingTargets != 0 {
		t.Fatalf("status %+v", pool.Status)
	}

	// A rank named twice keeps its worse state; the status lists it once.
	got := ranksOut([]*mgmtpb.RankTargetState{{Rank: 4, State: mgmtpb.TargetState_TARGET_UP}, {Rank: 4, State: mgmtpb.TargetState_TARGET_DOWN_OUT}})
	if len(got) != 1 || got[0].State != storagev1.TargetDownOut {
		t.Fatalf("ranksOut %+v", got)
	}
}
