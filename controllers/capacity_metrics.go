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
