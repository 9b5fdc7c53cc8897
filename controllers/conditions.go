package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// setCondition sets one condition, stamped with the generation it was computed for.
func setCondition(conds *[]metav1.Condition, gen int64, t string, s metav1.ConditionStatus, reason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
}

// Condition reasons about targets that are not up-and-in (down, or back and being reintegrated).
const (
	// reasonTargetsDown (Degraded, Pool): targets of the pool are excluded; their engines stopped
	// answering and their shards are served around.
	reasonTargetsDown = "TargetsDown"
	// reasonTargetsReintegrating (Degraded, Pool and ServerSet): engines are back and their
	// targets are being brought up to date; they take writes and serve no reads yet.
	reasonTargetsReintegrating = "TargetsReintegrating"
	// reasonWaitingForSystem (Progressing, ServerSet): a rolling upgrade holds before restarting
	// the next engine until every rank is joined with all its targets up and in.
	reasonWaitingForSystem = "WaitingForSystem"
	// reasonNotAllowed (Ready and Progressing, ServerSet): the ServerSet names an engine image, a
	// host path or a device the operator's configuration does not allow (policy.go); the message
	// names the field.
	reasonNotAllowed = "NotAllowed"
)
