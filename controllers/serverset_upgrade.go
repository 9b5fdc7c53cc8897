package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// templateHashKey records, on the StatefulSet, the hash of the pod template the operator last
// rendered; a new hash starts a rolling update.
const templateHashKey = "storage.peregrine.dev/template-hash"

func templateHash(t corev1.PodTemplateSpec) string {
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// rollState is what the next partition depends on.
type rollState struct {
	replicas       int32
	partition      int32 // of the StatefulSet as it is
	previousHash   string
	desiredHash    string
	updated, ready int32 // StatefulSet status
	observed       bool  // the StatefulSet controller has seen the current spec
	// systemHealthy: the management service reports every rank joined with all its targets up
	// and in (rollGate); systemMessage says which ranks it still waits for when not.
	systemHealthy bool
	systemMessage string
}

// podsRolled reports whether Kubernetes is done with the current step: the StatefulSet
// controller saw the spec, every pod from the partition up runs the new template, and all pods
// are ready. Readiness is only the engine's data port answering: the engine may still be joining
// or reintegrating, which systemHealthy covers.
func (s rollState) podsRolled() bool {
	return s.observed && s.updated >= s.replicas-s.partition && s.ready >= s.replicas
}

// waitingForSystem reports whether the roll holds only because of the system: the pods are done
// but the management service does not yet see every rank joined with every target up and in.
func (s rollState) waitingForSystem() bool {
	return s.partition > 0 && s.previousHash == s.desiredHash && s.podsRolled() && !s.systemHealthy
}

// nextPartition moves a rolling update one engine at a time, from the highest rank down: pods at
// or above the partition run the new template. It steps only when every pod from the partition up
// runs it, all pods are ready, and the system is whole again (rollGate: every rank joined and
// every target of every rank up-and-in in all its pools, so the engine just restarted is
// reintegrated everywhere), so a second engine never goes down while the first is still rejoining
// or its targets are still being brought up to date (redundancy holds).
func nextPartition(s rollState) int32 {
	switch {
	case s.previousHash != "" && s.previousHash != s.desiredHash && s.replicas > 1:
		return s.replicas - 1
	case s.partition <= 0:
		return 0
	case s.podsRolled() && s.systemHealthy:
		return s.partition - 1
	default:
		return s.partition
	}
}

func currentPartition(sts *appsv1.StatefulSet) int32 {
	if ru := sts.Spec.UpdateStrategy.RollingUpdate; ru != nil && ru.Partition != nil {
		return *ru.Partition
	}
	return 0
}

// systemHealthy asks the management service whether the system is whole enough for a rolling
// upgrade to restart the next engine (rollGate over its members). When not, the message says what
// it waits for: the ranks still down, not joined or reintegrating, or why the service could not
// be asked.
func (r *ServerSetReconciler) systemHealthy(ctx context.Context, ss *storagev1.ServerSet, replicas int32) (bool, string) {
	addr := mgmtAddress(ss)
	ms, err := r.MS.Client(targetOf(ss, addr))
	if err != nil {
		return false, fmt.Sprintf("management service %s: %v", addr, err)
	}
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	sys, err := ms.SystemQuery(cctx, &mgmtpb.SystemQueryReq{})
	if err != nil {
		return false, fmt.Sprintf("management service %s: system query: %s", addr, grpcMessage(err))
	}
	return rollGate(sys.Members, replicas)
}

// rollGate is the system's half of the rolling-upgrade gate, on the members of a SystemQuery: a
// rolling upgrade may restart the next engine only when every rank is joined AND has no target
// out (Member.targets_out == 0: each of its targets is TARGET_UP_IN in every pool it is part of,
// so the engine restarted last is not only back but reintegrated everywhere). Ranks 0..replicas-1
// must all be members; every member counts, whatever its rank. When not ready, the message names
// each rank held back, by rank: "rank 1: stopped", "rank 2: 1 target(s) not up-and-in in its
// pools", "rank 3: not a member of the system".
func rollGate(members []*mgmtpb.Member, replicas int32) (ready bool, message string) {
	byRank := map[uint32]*mgmtpb.Member{}
	for _, m := range members {
		byRank[m.Rank] = m
	}
	ranks := make([]uint32, 0, len(byRank)+int(max(replicas, 0)))
	for r := range byRank {
		ranks = append(ranks, r)
	}
	for r := uint32(0); int64(r) < int64(replicas); r++ {
		if byRank[r] == nil {
			ranks = append(ranks, r)
		}
	}
	slices.Sort(ranks)
	var waiting []string
	for _, r := range ranks {
		m := byRank[r]
		switch {
		case m == nil:
			waiting = append(waiting, fmt.Sprintf("rank %d: not a member of the system", r))
		case m.State != mgmtpb.MemberState_MEMBER_STATE_JOINED && m.TargetsOut > 0:
			waiting = append(waiting, fmt.Sprintf("rank %d: %s, %d target(s) not up-and-in in its pools", r, stateWord(m.State), m.TargetsOut))
		case m.State != mgmtpb.MemberState_MEMBER_STATE_JOINED:
			waiting = append(waiting, fmt.Sprintf("rank %d: %s", r, stateWord(m.State)))
		case m.TargetsOut > 0:
			waiting = append(waiting, fmt.Sprintf("rank %d: %d target(s) not up-and-in in its pools", r, m.TargetsOut))
		}
	}
	if len(waiting) > 0 {
		return false, strings.Join(waiting, "; ")
	}
	return true, fmt.Sprintf("all %d ranks joined, every target up and in", len(ranks))
}

func stateWord(s mgmtpb.MemberState) string {
	if w := s.Word(); w != "" {
		return w
	}
	return "state unknown"
}
