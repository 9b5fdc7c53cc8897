// Package deploy holds the checks of the CSI driver's Kubernetes manifests (config/csi) and
// samples (config/samples/csi): deploy_test.go builds them with kustomize, applies them to a
// real API server (envtest) and checks the wiring the driver depends on. There is no non-test
// code.
package deploy
