package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ServerSetSpec describes a set of Peregrine engines: one StatefulSet pod per engine, ordinal = rank.
// +kubebuilder:validation:XValidation:rule="self.mgmtSvcReplicas <= self.engines",message="mgmtSvcReplicas must not exceed engines",fieldPath=".mgmtSvcReplicas"
// +kubebuilder:validation:XValidation:rule="!has(self.metricsPort) || ((!has(self.controlPort) || self.metricsPort != self.controlPort) && (!has(self.dataPort) || self.metricsPort != self.dataPort))",message="metricsPort must differ from controlPort and dataPort",fieldPath=".metricsPort"
type ServerSetSpec struct {
	// Image of the engine (contains peregrine-engine and peregrine).
	// +kubebuilder:validation:MinLength=1
	Image string `json:"image"`
	// +optional
	// +kubebuilder:default=IfNotPresent
	ImagePullPolicy corev1.PullPolicy `json:"imagePullPolicy,omitempty"`

	// Engines is the number of engines (StatefulSet replicas). Scaling down is refused until
	// the engines are drained.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1024
	Engines int32 `json:"engines"`

	// Targets per engine (worker threads, each owning its shards).
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	Targets int32 `json:"targets,omitempty"`

	// Hugepages (2 MiB pages) per engine, requested and limited equally. Zero or unset runs the
	// engine without hugepages.
	// +optional
	Hugepages *resource.Quantity `json:"hugepages,omitempty"`

	// Storage of each engine.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="storage is immutable: engines keep their devices"
	Storage EngineStorage `json:"storage"`

	// Fabric the data plane uses; passed to the engine container as environment variables.
	// +optional
	Fabric Fabric `json:"fabric,omitempty"`

	// HostNetwork runs the engines in the node's network namespace.
	// +optional
	HostNetwork bool `json:"hostNetwork,omitempty"`

	// MgmtSvcReplicas is the number of engines (ranks 0..n-1) that host the management service.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Enum=1;3;5
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="mgmtSvcReplicas is immutable"
	MgmtSvcReplicas int32 `json:"mgmtSvcReplicas,omitempty"`

	// ControlPort serves the management gRPC API.
	// +optional
	// +kubebuilder:default=10001
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	ControlPort int32 `json:"controlPort,omitempty"`
	// DataPort serves the data plane.
	// +optional
	// +kubebuilder:default=10101
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	DataPort int32 `json:"dataPort,omitempty"`
	// MetricsPort serves the engine's Prometheus metrics (GET /metrics, port name "metrics") on
	// the pod IP (with hostNetwork, the node's: ServerSets sharing nodes need
	// distinct ports, as for controlPort and dataPort).
	// +optional
	// +kubebuilder:default=9464
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=65535
	MetricsPort int32 `json:"metricsPort,omitempty"`

	// FlushInterval: the longest an engine keeps an acknowledged update in its device's volatile
	// write cache before flushing on its own (fsync and sync=always containers flush at once);
	// what a power cut may lose of writes not fsync'ed. The engine's default (1s) when unset.
	// +optional
	// +kubebuilder:validation:XValidation:rule="duration(self) >= duration('1ms') && duration(self) <= duration('60s')",message="flushInterval must be between 1ms and 60s"
	FlushInterval *metav1.Duration `json:"flushInterval,omitempty"`

	// LogLevel of the engines.
	// +optional
	// +kubebuilder:default=info
	// +kubebuilder:validation:Enum=error;warn;info;debug;trace
	LogLevel string `json:"logLevel,omitempty"`

	// InsecureControlPlane runs the engines' gRPC API (management, joins) without TLS: anyone
	// who reaches a control port may then administer the system and join as any rank. Without
	// it the operator keeps a CA for the ServerSet and mutual TLS certificates for every rank
	// (Secrets NAME-ca and NAME-RANK-tls). Refused unless the operator runs with
	// --allow-insecure-control-plane.
	// +optional
	InsecureControlPlane bool `json:"insecureControlPlane,omitempty"`
	// +optional
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`
	// +optional
	Affinity *corev1.Affinity `json:"affinity,omitempty"`
	// +optional
	Tolerations []corev1.Toleration `json:"tolerations,omitempty"`
	// Resources of the engine container; hugepages and a memory request covering the SCM tier
	// are added when absent.
	// +optional
	Resources corev1.ResourceRequirements `json:"resources,omitempty"`
}

// EngineStorage is one engine's storage: SCM (RAM) and either an NVMe device or an emulated one.
// +kubebuilder:validation:XValidation:rule="has(self.nvme) != has(self.emulated)",message="exactly one of nvme and emulated must be set"
type EngineStorage struct {
	// SCM is the size of the RAM tier (metadata and small values), at least 16MiB per target.
	Scm Size `json:"scm"`
	// NVMe device on every engine's node.
	// +optional
	Nvme *NvmeStorage `json:"nvme,omitempty"`
	// Emulated NVMe: a file on a host directory.
	// +optional
	Emulated *EmulatedStorage `json:"emulated,omitempty"`
}

// NvmeStorage is a kernel block device (an NVMe namespace, by path or by-id link), passed into the pod.
type NvmeStorage struct {
	// +kubebuilder:validation:Pattern=`^/dev/.+`
	Device string `json:"device"`
}

// EmulatedStorage is a sparse file of a given size per engine, on a directory of the node.
type EmulatedStorage struct {
	// HostPath is the node directory holding the device files (created when missing).
	// +kubebuilder:validation:Pattern=`^/.+`
	HostPath string `json:"hostPath"`
	// Size of each engine's device file, at least 64MiB per target.
	Size Size `json:"size"`
}

// Fabric selects the data-plane transport. The engine's configuration has no fabric keys (its
// data plane is TCP on the pod IP and data port, plus shared memory for clients on the same
// node), so the operator does not write these into the engine config: they reach the engine
// container as the environment variables PEREGRINE_FABRIC_PROVIDER and PEREGRINE_FABRIC_INTERFACE.
type Fabric struct {
	// Provider: "tcp" (plain TCP or libfabric tcp), "shm" (one node) or "verbs".
	// +optional
	// +kubebuilder:validation:Enum=tcp;shm;verbs
	Provider string `json:"provider,omitempty"`
	// Interface the data plane binds, e.g. eth0.
	// +optional
	Interface string `json:"interface,omitempty"`
}

// EngineStatus is one rank as the management service sees it.
type EngineStatus struct {
	Rank        int32       `json:"rank"`
	UUID        string      `json:"uuid,omitempty"`
	State       EngineState `json:"state"`
	ControlAddr string      `json:"controlAddr,omitempty"`
	FaultDomain string      `json:"faultDomain,omitempty"`
	// Formatted reports whether the rank's device carries this system's format.
	Formatted bool `json:"formatted,omitempty"`
	// StorageState is the rank's storage as its engine reports it: "ready", "maintenance"
	// (not formatted or not openable), or "degraded" (targets refuse updates after a device
	// write failed; the engine must restart).
	StorageState StorageState `json:"storageState,omitempty"`
	// Message explains a rank in maintenance or degraded.
	Message string `json:"message,omitempty"`
	// TargetsOut counts the rank's targets that are not up-and-in, summed over its pools: down
	// (excluded while the engine is away) or back and still being reintegrated. 0 once a
	// returning engine is reintegrated everywhere.
	// +optional
	TargetsOut int32 `json:"targetsOut,omitempty"`
}

// ServerSetStatus is copied from the management service (SystemQuery, StorageScan).
type ServerSetStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// MgmtAddress is where the operator reaches the management service ("host:port").
	// +optional
	MgmtAddress string `json:"mgmtAddress,omitempty"`
	// System is the name of the engine system.
	// +optional
	System string `json:"system,omitempty"`
	// ReadyEngines counts ranks in state "joined".
	// +optional
	ReadyEngines int32 `json:"readyEngines,omitempty"`
	// EnginesWithTargetsOut counts ranks with targets that are not up-and-in in some pool (down,
	// or back and still being reintegrated). A rolling upgrade restarts the next engine only
	// when it is 0 and every rank is joined.
	// +optional
	EnginesWithTargetsOut int32 `json:"enginesWithTargetsOut,omitempty"`
	// MapVersion of the system map.
	// +optional
	MapVersion int64 `json:"mapVersion,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=rank
	Engines []EngineStatus `json:"engines,omitempty"`
	// Capacity per tier, summed over ranks.
	// +optional
	Capacity []TierStatus `json:"capacity,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// ServerSet runs a Peregrine engine system.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pss,categories=peregrine
// +kubebuilder:printcolumn:name="Engines",type=integer,JSONPath=`.spec.engines`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyEngines`
// +kubebuilder:printcolumn:name="Engines-Out",type=integer,JSONPath=`.status.enginesWithTargetsOut`,description="Engines with targets down or being reintegrated in some pool"
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type ServerSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ServerSetSpec   `json:"spec"`
	Status ServerSetStatus `json:"status,omitempty"`
}

// ServerSetList is a list of ServerSets.
// +kubebuilder:object:root=true
type ServerSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ServerSet `json:"items"`
}

func init() {
	SchemeBuilder.Register(&ServerSet{}, &ServerSetList{})
}
