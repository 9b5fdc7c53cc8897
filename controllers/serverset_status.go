package controllers

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// observeSystem copies the system map and the storage of every rank into the status and formats
// storage on first start. It returns an error only when the management service cannot be asked;
// a refused format is a condition, not an error.
func (r *ServerSetReconciler) observeSystem(ctx context.Context, ss *storagev1.ServerSet) error {
	ms, err := r.MS.Client(targetOf(ss, ss.Status.MgmtAddress))
	if err != nil {
		return err
	}
	sys, scan, err := r.query(ctx, ms)
	if err != nil {
		return err
	}
	if formatted := r.formatIfNeeded(ctx, ss, ms, sys); formatted {
		if sys, scan, err = r.query(ctx, ms); err != nil {
			return err
		}
	}
	copySystemStatus(ss, sys, scan)
	return nil
}

func (r *ServerSetReconciler) query(ctx context.Context, ms mgmtpb.MgmtClient) (*mgmtpb.SystemQueryResp, *mgmtpb.StorageScanResp, error) {
	cctx, cancel := r.MS.callContext(ctx)
	defer cancel()
	sys, err := ms.SystemQuery(cctx, &mgmtpb.SystemQueryReq{})
	if err != nil {
		return nil, nil, fmt.Errorf("system query: %s", grpcMessage(err))
	}
	scan, err := ms.StorageScan(cctx, &mgmtpb.StorageScanReq{})
	if err != nil {
		return nil, nil, fmt.Errorf("storage scan: %s", grpcMessage(err))
	}
	return sys, scan, nil
}

// formatIfNeeded formats the ranks waiting in maintenance. On a first start (no rank formatted
// yet) it waits until all engines have joined, so that the system is formatted at once; once the
// system runs, a rank that joins later (scaling up) is formatted as soon as it joins, without
// waiting for the other new ranks (a pod that cannot be scheduled holds nobody else back).
// Formatting is idempotent on ranks that are formatted already. Devices with a foreign signature
// are only overwritten when the ServerSet carries the force annotation and no engine of the
// system is formatted yet (a first start). It reports whether it formatted.
func (r *ServerSetReconciler) formatIfNeeded(ctx context.Context, ss *storagev1.ServerSet, ms mgmtpb.MgmtClient, sys *mgmtpb.SystemQueryResp) bool {
	var waiting, joined []string
	for _, m := range sys.Members {
		switch m.State {
		case mgmtpb.MemberState_MEMBER_STATE_MAINTENANCE:
			waiting = append(waiting, fmt.Sprint(m.Rank))
		case mgmtpb.MemberState_MEMBER_STATE_JOINED:
			joined = append(joined, fmt.Sprint(m.Rank))
		}
	}
	cond := metav1.Condition{Type: storagev1.ConditionStorageFormatted, ObservedGeneration: ss.Generation}
	switch {
	case len(sys.Members) == 0:
		cond.Status, cond.Reason = metav1.ConditionUnknown, string(storagev1.ReasonWaitingForEngines)
		cond.Message = "no engine has joined the management service yet"
	case len(waiting) == 0:
		cond.Status, cond.Reason, cond.Message = metav1.ConditionTrue, string(storagev1.ReasonFormatted), "every joined engine has formatted storage"
	case len(joined) == 0 && int32(len(sys.Members)) < ss.Spec.Engines:
		cond.Status, cond.Reason = metav1.ConditionFalse, string(storagev1.ReasonWaitingForEngines)
		cond.Message = fmt.Sprintf("%d of %d engines have joined; a first start formats storage once all have", len(sys.Members), ss.Spec.Engines)
	default:
		force := ss.Annotations[storagev1.AnnotationForceFormat] == "true" && len(joined) == 0
		cctx, cancel := r.MS.callContext(ctx)
		defer cancel()
		_, err := ms.StorageFormat(cctx, &mgmtpb.StorageFormatReq{Force: force})
		if err == nil {
			cond.Status, cond.Reason = metav1.ConditionTrue, string(storagev1.ReasonFormatted)
			cond.Message = fmt.Sprintf("formatted ranks %s", strings.Join(waiting, ", "))
			if force {
				cond.Message += " (forced by annotation " + storagev1.AnnotationForceFormat + ")"
			}
			r.Recorder.Event(ss, corev1.EventTypeNormal, string(storagev1.ReasonFormatted), cond.Message)
			meta.SetStatusCondition(&ss.Status.Conditions, cond)
			return true
		}
		cond.Status = metav1.ConditionFalse
		reason, msg := formatFailure(err, sys)
		cond.Reason, cond.Message = string(reason), msg
		if reason == storagev1.ReasonFormatRefused {
			// Only a refusal to overwrite a device is what the force annotation is about.
			switch {
			case ss.Annotations[storagev1.AnnotationForceFormat] == "true" && len(joined) > 0:
				cond.Message += fmt.Sprintf("; %s=true only applies to a first start, and ranks %s are formatted already",
					storagev1.AnnotationForceFormat, strings.Join(joined, ", "))
			case !force:
				cond.Message += fmt.Sprintf("; waiting: set annotation %s: \"true\" on the ServerSet to overwrite",
					storagev1.AnnotationForceFormat)
			}
		}
		if old := meta.FindStatusCondition(ss.Status.Conditions, cond.Type); old == nil || old.Message != cond.Message {
			r.Recorder.Event(ss, corev1.EventTypeWarning, cond.Reason, cond.Message)
		}
	}
	meta.SetStatusCondition(&ss.Status.Conditions, cond)
	return false
}

// What the management service's StorageFormat error says, in the words of the engine: it fails
// the whole call with FAILED_PRECONDITION "storage format: <failure>; <failure>..." where a
// failure is "rank N: engine is stopped" (no heartbeat, engine/crates/engine/src/ms.rs),
// "engine at HOST:PORT: ..." (the MS could not connect to the rank's control address), or the
// rank's own answer "rank N: format DEVICE: ..." whose refusal to overwrite a device with a
// foreign signature or another system's format ends in "without force" (vos superblock format).
var (
	formatRankStopped      = regexp.MustCompile(`rank (\d+): engine is stopped`)
	formatEngineNotReached = regexp.MustCompile(`engine at (\S+?): `)
)

const formatRefusedMarker = "without force"

// formatFailure sorts a failed StorageFormat into the condition's reason and message:
// FormatRefused when a device carries a foreign signature (the force annotation can help),
// RankUnreachable when the management service could not reach a rank (it names the ranks),
// FormatFailed otherwise. The message always carries the management service's own error.
func formatFailure(err error, sys *mgmtpb.SystemQueryResp) (reason storagev1.ConditionReason, msg string) {
	msg = grpcMessage(err)
	code := grpcCode(err)
	if code != codes.FailedPrecondition {
		return storagev1.ReasonFormatFailed, fmt.Sprintf("storage format: %s (%s)", msg, code)
	}
	if strings.Contains(msg, formatRefusedMarker) {
		return storagev1.ReasonFormatRefused, msg
	}
	var unreachable []string
	seen := map[string]bool{}
	add := func(rank string) {
		if !seen[rank] {
			seen[rank] = true
			unreachable = append(unreachable, rank)
		}
	}
	for _, m := range formatRankStopped.FindAllStringSubmatch(msg, -1) {
		add("rank " + m[1])
	}
	for _, m := range formatEngineNotReached.FindAllStringSubmatch(msg, -1) {
		who := "engine at " + m[1]
		for _, mem := range sys.Members {
			if mem.ControlAddr == m[1] {
				who = fmt.Sprintf("rank %d", mem.Rank)
			}
		}
		add(who)
	}
	if len(unreachable) == 0 {
		return storagev1.ReasonFormatFailed, msg
	}
	return storagev1.ReasonRankUnreachable, fmt.Sprintf("the management service cannot reach %s: %s", strings.Join(unreachable, ", "), msg)
}

// copySystemStatus copies ranks, their states and the capacity per tier from the management service.
func copySystemStatus(ss *storagev1.ServerSet, sys *mgmtpb.SystemQueryResp, scan *mgmtpb.StorageScanResp) {
	storage := map[uint32]*mgmtpb.RankStorage{}
	var scmTotal, scmFree, nvmeTotal, nvmeFree uint64
	for _, rs := range scan.Ranks {
		storage[rs.Rank] = rs
		if rs.Formatted && rs.State == mgmtpb.StorageState_STORAGE_STATE_READY {
			scmTotal += rs.ScmBytes
			scmFree += rs.ScmFree
			nvmeTotal += rs.BdevBytes
			nvmeFree += rs.NvmeFree
		}
	}
	ss.Status.Engines = nil
	ss.Status.ReadyEngines, ss.Status.EnginesWithTargetsOut = 0, 0
	for _, m := range sys.Members {
		e := storagev1.EngineStatus{
			Rank: int32(m.Rank), UUID: m.Uuid, State: storagev1.EngineState(m.State.Word()), ControlAddr: m.ControlAddr, FaultDomain: m.FaultDomain,
			TargetsOut: int32(m.TargetsOut),
		}
		if rs := storage[m.Rank]; rs != nil {
			e.Formatted = rs.Formatted && rs.System == sys.System
			e.StorageState = storagev1.StorageState(rs.State.Word())
			e.Message = rs.Message
		}
		if m.State == mgmtpb.MemberState_MEMBER_STATE_JOINED {
			ss.Status.ReadyEngines++
		}
		if m.TargetsOut > 0 {
			ss.Status.EnginesWithTargetsOut++
		}
		ss.Status.Engines = append(ss.Status.Engines, e)
	}
	sort.Slice(ss.Status.Engines, func(i, j int) bool { return ss.Status.Engines[i].Rank < ss.Status.Engines[j].Rank })
	ss.Status.System = sys.System
	ss.Status.MapVersion = int64(sys.MapVersion)
	ss.Status.Capacity = []storagev1.TierStatus{
		{Name: "scm", Total: int64(scmTotal), Free: int64(scmFree)},
		{Name: "nvme", Total: int64(nvmeTotal), Free: int64(nvmeFree)},
	}
}

// setConditions summarises the system in Ready, Degraded and Progressing. Degraded is True while
// an engine is down (EnginesDown) or, all engines up, while a rank still has targets that are not
// up-and-in in some pool (TargetsReintegrating: back, being brought up to date). rollHold, when
// not empty, is what a rolling upgrade waits for before restarting the next engine
// (Progressing WaitingForSystem).
func (r *ServerSetReconciler) setConditions(ss *storagev1.ServerSet, live *appsv1.StatefulSet, replicas int32, rollHold string, msErr error) {
	gen := ss.Generation
	set := func(t string, s metav1.ConditionStatus, reason storagev1.ConditionReason, msg string) {
		setCondition(&ss.Status.Conditions, gen, t, s, reason, msg)
	}
	if msErr != nil {
		msg := fmt.Sprintf("management service %s: %v", ss.Status.MgmtAddress, msErr)
		set(storagev1.ConditionReady, metav1.ConditionFalse, storagev1.ReasonManagementServiceUnreachable, msg)
		set(storagev1.ConditionDegraded, metav1.ConditionUnknown, storagev1.ReasonManagementServiceUnreachable, msg)
	} else {
		var down, out []string
		for _, e := range ss.Status.Engines {
			if e.State != storagev1.EngineJoined && e.State != storagev1.EngineMaintenance {
				down = append(down, fmt.Sprintf("rank %d %s", e.Rank, e.State))
			} else if e.StorageState == storagev1.StorageDegraded {
				down = append(down, fmt.Sprintf("rank %d degraded: %s", e.Rank, e.Message))
			}
			if e.TargetsOut > 0 {
				out = append(out, fmt.Sprintf("rank %d: %d target(s) not up-and-in in its pools", e.Rank, e.TargetsOut))
			}
		}
		switch {
		case len(down) > 0:
			msg := strings.Join(down, ", ")
			if len(out) > 0 {
				msg += "; " + strings.Join(out, ", ")
			}
			set(storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonEnginesDown, msg)
		case len(out) > 0:
			set(storagev1.ConditionDegraded, metav1.ConditionTrue, storagev1.ReasonTargetsReintegrating,
				"every engine is up; targets still being reintegrated: "+strings.Join(out, ", "))
		default:
			set(storagev1.ConditionDegraded, metav1.ConditionFalse, storagev1.ReasonAllEnginesUp, "no engine is stopped or excluded, every target is up and in")
		}
		msg := fmt.Sprintf("%d of %d engines joined", ss.Status.ReadyEngines, ss.Spec.Engines)
		if ss.Status.ReadyEngines >= ss.Spec.Engines {
			set(storagev1.ConditionReady, metav1.ConditionTrue, storagev1.ReasonEnginesJoined, msg)
		} else {
			reason := storagev1.ReasonEnginesNotReady
			if c := meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionStorageFormatted); c != nil && c.Status != metav1.ConditionTrue {
				reason, msg = storagev1.ConditionReason(c.Reason), msg+"; "+c.Message
			}
			set(storagev1.ConditionReady, metav1.ConditionFalse, reason, msg)
		}
	}
	switch {
	case replicas > ss.Spec.Engines:
		set(storagev1.ConditionProgressing, metav1.ConditionFalse, storagev1.ReasonScaleDownRefused,
			fmt.Sprintf("scaling from %d to %d engines is refused until ranks %d-%d are drained from the system",
				replicas, ss.Spec.Engines, ss.Spec.Engines, replicas-1))
	case rollHold != "":
		var updated int32
		if live != nil {
			updated = live.Status.UpdatedReplicas
		}
		set(storagev1.ConditionProgressing, metav1.ConditionTrue, storagev1.ReasonWaitingForSystem,
			fmt.Sprintf("%d of %d engine pods updated and all ready; the next engine restarts once every rank is joined with all its targets up and in: %s",
				updated, replicas, rollHold))
	case live == nil || live.Status.ObservedGeneration < live.Generation || live.Status.UpdatedReplicas < replicas || live.Status.ReadyReplicas < replicas:
		var ready, updated int32
		if live != nil {
			ready, updated = live.Status.ReadyReplicas, live.Status.UpdatedReplicas
		}
		set(storagev1.ConditionProgressing, metav1.ConditionTrue, storagev1.ReasonRollingOut,
			fmt.Sprintf("%d of %d engine pods ready, %d updated", ready, replicas, updated))
	default:
		set(storagev1.ConditionProgressing, metav1.ConditionFalse, storagev1.ReasonRolledOut, fmt.Sprintf("%d engine pods ready and updated", replicas))
	}
}

// emitConditionEvents records an event for each condition that changed status or reason.
func (r *ServerSetReconciler) emitConditionEvents(ss, before *storagev1.ServerSet) {
	for _, t := range []string{storagev1.ConditionReady, storagev1.ConditionDegraded, storagev1.ConditionControlPlaneTLS} {
		a := meta.FindStatusCondition(ss.Status.Conditions, t)
		b := meta.FindStatusCondition(before.Status.Conditions, t)
		if a == nil || (b != nil && a.Status == b.Status && a.Reason == b.Reason) {
			continue
		}
		kind := corev1.EventTypeNormal
		if (t != storagev1.ConditionDegraded && a.Status != metav1.ConditionTrue) || (t == storagev1.ConditionDegraded && a.Status == metav1.ConditionTrue) {
			kind = corev1.EventTypeWarning
		}
		r.Recorder.Event(ss, kind, a.Reason, fmt.Sprintf("%s=%s: %s", t, a.Status, a.Message))
	}
}
