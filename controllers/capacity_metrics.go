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
	// poolInfo ties a Pool object to its UUID in the store, which the engines' own metrics
	// (docs/metrics.md) carry as their "pool" label: dashboards join the two on it.
	poolInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "peregrine_pool_info",
		Help: "1 for each Pool with its UUID and label in the store (the engines' metrics name pools by UUID).",
	}, []string{"namespace", "pool", "uuid", "label"})
	containerUsedBytes = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "peregrine_container_used_bytes",
		Help: "Bytes used by a container as the management service reports it.",
	}, []string{"namespace", "pool", "container"})
)

func init() {
	metrics.Registry.MustRegister(poolBytes, poolInfo, containerUsedBytes)
}

// forgetPoolMetrics drops the series of a Pool that is gone from Kubernetes or from the store:
// a gauge of a pool that no longer exists would report space nobody has.
func forgetPoolMetrics(namespace, pool string) {
	poolBytes.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
	poolInfo.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
}

// setPoolInfo records the UUID and label a Pool has in the store (one series per Pool).
func setPoolInfo(namespace, pool, uuid, label string) {
	// A Pool adopted again under another UUID, or relabelled, keeps one series.
	poolInfo.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "pool": pool})
	poolInfo.WithLabelValues(namespace, pool, uuid, label).Set(1)
}

// forgetContainerMetrics drops the series of a Container that is gone from Kubernetes or from
// the store.
func forgetContainerMetrics(namespace, container string) {
	containerUsedBytes.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "container": container})
}
