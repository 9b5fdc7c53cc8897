package controllers

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// Setup registers the indexes and the three reconcilers with mgr, sharing one set of
// management-service connections; refresh is how often status is re-read from the store.
func Setup(mgr ctrl.Manager, refresh time.Duration) error {
	if err := SetupIndexes(context.Background(), mgr); err != nil {
		return err
	}
	ms := &ManagementServices{}
	if err := (&ServerSetReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), MS: ms, Refresh: refresh,
		Recorder: mgr.GetEventRecorderFor("serverset-controller")}).SetupWithManager(mgr); err != nil {
		return err
	}
	if err := (&PoolReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), MS: ms, Refresh: refresh,
		Recorder: mgr.GetEventRecorderFor("pool-controller")}).SetupWithManager(mgr); err != nil {
		return err
	}
	return (&ContainerReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), MS: ms, Refresh: refresh,
		Recorder: mgr.GetEventRecorderFor("container-controller")}).SetupWithManager(mgr)
}
