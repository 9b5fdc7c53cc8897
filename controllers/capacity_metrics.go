package controllers

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Capacity gauges, exported beside the controller-runtime metrics, from the last status copy.
var (
	poolBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "peregrine_pool_bytes",
		Help: "Pool space per tier as the management service reports it (kind: total or free).",
	}, []string{"namespace", "pool", "tier", "kind"})
	containerUsedBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "peregrine_container_used_bytes",
		Help: "Bytes used by a container as the management service reports it.",
	}, []string{"namespace", "pool", "container"})
)

func init() {
	metrics.Registry.MustRegister(poolBytes, containerUsedBytes)
}

// forgetPoolMetrics drops the series of a Pool that is gone from Kubernetes or from the store:
// a gauge of a pool that no longer exists would report space nobody has.
func forgetPoolMetrics(namespace, pool string) {
	poolBytes.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
}

// forgetContainerMetrics drops the series of a Container that is gone from Kubernetes or from
// the store.
func forgetContainerMetrics(namespace, container string) {
	containerUsedBytes.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "container": container})
}
