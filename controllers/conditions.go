package controllers

import (
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// setCondition sets one condition, stamped with the generation it was computed for. Condition
// types and reasons are the constants of api/v1alpha1.
func setCondition(conds *[]metav1.Condition, gen int64, t string, s metav1.ConditionStatus, reason storagev1.ConditionReason, msg string) {
	meta.SetStatusCondition(conds, metav1.Condition{Type: t, Status: s, Reason: string(reason), Message: msg, ObservedGeneration: gen})
}
