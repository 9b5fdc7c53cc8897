package v1alpha1

// Annotations understood by the operator.
const (
	// AnnotationForceFormat, set to "true" on a ServerSet, lets the first format overwrite devices
	// that carry a foreign signature (another file system, another Peregrine system).
	AnnotationForceFormat = "storage.peregrine.dev/force-format"
	// AnnotationMgmtAddress, set on a ServerSet, names the management service ("host:port") the
	// operator talks to instead of the address derived from the ServerSet's Service: an engine
	// system that runs outside the cluster, an operator running outside the cluster, or tests.
	AnnotationMgmtAddress = "storage.peregrine.dev/mgmt-address"
)

// ConditionType names a condition of a ServerSet, Pool or Container (metav1.Condition.Type); an
// alias of string, as the metav1 condition helpers take one. Reasons: ConditionReason.
type ConditionType = string

// Condition types.
const (
	ConditionReady            ConditionType = "Ready"
	ConditionProgressing      ConditionType = "Progressing"
	ConditionDegraded         ConditionType = "Degraded"
	ConditionStorageFormatted ConditionType = "StorageFormatted"
	// ConditionDeletionBlocked is True while a finalizer holds a deletion back (the reason says why).
	ConditionDeletionBlocked ConditionType = "DeletionBlocked"
	// ConditionControlPlaneTLS (ServerSet) is True when the engines' gRPC API runs with mutual
	// TLS from the ServerSet's CA and every certificate is in place; the reason says whether a CA
	// rotation is under way, or why not (InsecureControlPlane, CertificateError).
	ConditionControlPlaneTLS ConditionType = "ControlPlaneTLS"
)

// Finalizer held by Pools and Containers until the store has released (or retained) them.
const Finalizer = "storage.peregrine.dev/finalizer"

// ReclaimPolicy says what happens to the store's object when its Kubernetes object is deleted.
// +kubebuilder:validation:Enum=Delete;Retain
type ReclaimPolicy string

const (
	// ReclaimDelete destroys the pool or container in the store.
	ReclaimDelete ReclaimPolicy = "Delete"
	// ReclaimRetain leaves the pool or container in the store; a new object with the same label adopts it.
	ReclaimRetain ReclaimPolicy = "Retain"
)

// ObjectClass is a Peregrine object class: striping (S*), replication (RP_*) or erasure coding (EC_*).
// +kubebuilder:validation:Enum=S1;S2;S4;SX;RP_2G1;RP_3G1;RP_2GX;EC_2P1G1;EC_4P2G1;EC_2P1GX
type ObjectClass string

// Size is a byte count as the engines write it: a number with an optional binary unit,
// "4GiB", "512MiB", "4G", "100M", "1.5T" or "4096".
// +kubebuilder:validation:Pattern=`^[0-9]+(\.[0-9]+)?([KMGTkmgt]([iI]?[bB])?|[bB])?$`
// +kubebuilder:validation:MaxLength=32
type Size string

// LocalObjectReference names an object in the same namespace.
type LocalObjectReference struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name"`
}

// TierStatus is one storage tier's space as the management service reports it.
type TierStatus struct {
	// Name is "scm" or "nvme".
	Name string `json:"name"`
	// Total bytes.
	Total int64 `json:"total"`
	// Free bytes.
	Free int64 `json:"free"`
}
