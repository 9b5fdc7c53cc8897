package controllers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

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
	systemHealthy  bool  // the management service reports every rank joined
}

// nextPartition moves a rolling update one engine at a time, from the highest rank down: pods at
// or above the partition run the new template. It steps only when every pod from the partition up
// runs it, all pods are ready, and the management service sees the whole system joined again, so
// a second engine never goes down while the first is still rejoining (redundancy holds).
func nextPartition(s rollState) int32 {
	switch {
	case s.previousHash != "" && s.previousHash != s.desiredHash && s.replicas > 1:
		return s.replicas - 1
	case s.partition <= 0:
		return 0
	case s.observed && s.updated >= s.replicas-s.partition && s.ready >= s.replicas && s.systemHealthy:
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

// systemHealthy asks the management service whether at least `replicas` ranks are joined.
func (r *ServerSetReconciler) systemHealthy(ctx context.Context, ss *storagev1.ServerSet, replicas int32) bool {
	ms, err := r.MS.Client(mgmtAddress(ss))
	if err != nil {
		return false
	}
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	sys, err := ms.SystemQuery(cctx, &mgmtpb.SystemQueryReq{})
	if err != nil {
		return false
	}
	var joined int32
	for _, m := range sys.Members {
		if m.State == "joined" {
			joined++
		}
	}
	return joined >= replicas
}
