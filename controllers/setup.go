package controllers

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// The metrics endpoint's authentication and authorization (cmd/operator: --metrics-secure):
// controller-runtime's filter asks the API server whether a scraper's token is valid and whether
// it may get /metrics.
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create

// Setup registers the indexes and the three reconcilers with mgr, sharing one set of
// management-service connections; refresh is how often status is re-read from the store, policy
// what ServerSets may run (policy.go), tls the control plane's certificates (serverset_tls.go).
func Setup(mgr ctrl.Manager, refresh time.Duration, policy EnginePolicy, tls TLSOptions) error {
	if err := policy.Validate(); err != nil {
		return err
	}
	if err := SetupIndexes(context.Background(), mgr); err != nil {
		return err
	}
	ms := &ManagementServices{Certs: &AdminCerts{Reader: mgr.GetAPIReader()}}
	if err := (&ServerSetReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), MS: ms, Refresh: refresh, Policy: policy,
		TLS: tls, APIReader: mgr.GetAPIReader(),
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
