package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ContainerSpec is a container inside a pool.
type ContainerSpec struct {
	// PoolRef names the Pool (same namespace).
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="poolRef is immutable"
	PoolRef LocalObjectReference `json:"poolRef"`

	// Label of the container in the store; defaults to the object's name.
	// +optional
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._:-]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="label is immutable"
	Label string `json:"label,omitempty"`

	// Type of the container.
	// +optional
	// +kubebuilder:default=POSIX
	// +kubebuilder:validation:Enum=POSIX
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="type is immutable"
	Type string `json:"type,omitempty"`

	// ObjectClass of files.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="objectClass is immutable"
	ObjectClass ObjectClass `json:"objectClass,omitempty"`
	// DirObjectClass of directories.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="dirObjectClass is immutable"
	DirObjectClass ObjectClass `json:"dirObjectClass,omitempty"`

	// ChunkSize of files ("1MiB" when unset).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="chunkSize is immutable"
	ChunkSize Size `json:"chunkSize,omitempty"`

	// RedundancyFactor: engine failures the container survives, at most the pool's.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="redundancyFactor is immutable"
	RedundancyFactor *int32 `json:"redundancyFactor,omitempty"`

	// Checksum of data end to end.
	// +optional
	// +kubebuilder:validation:Enum=crc32c;off
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="checksum is immutable"
	Checksum string `json:"checksum,omitempty"`

	// Sync: when an update is acknowledged. "standard" (the default): once written to the engines'
	// devices, as a local file system's write(2); it survives the crash of any process, and fsync,
	// O_SYNC/O_DSYNC or the engines' flush interval make it survive a power cut. "always": every
	// update is flushed from the devices' write caches before it is acknowledged.
	// +optional
	// +kubebuilder:validation:Enum=standard;always
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="sync is immutable"
	Sync string `json:"sync,omitempty"`

	// ACL of the container in the store (its property acl), in the syntax of the Pool's acl:
	// entries A:<flags>:<principal>:<perms> separated by commas. Unset: the store's default ACL.
	// +optional
	ACL ACL `json:"acl,omitempty"`

	// Owner of the container in the store (property owner): a user name followed by @.
	// Unset: the creator's identity (root@ for the operator).
	// +optional
	Owner Principal `json:"owner,omitempty"`
	// Group owning the container in the store (property group): a group name followed by @.
	// Unset: the creator's group (root@ for the operator).
	// +optional
	Group Principal `json:"group,omitempty"`

	// AllowedNamespaces lists the Kubernetes namespaces ("team-a") or service accounts
	// ("team-a/trainer") whose pods may mount the container through the CSI driver (property
	// user.peregrine.io/namespaces), on top of its Pool's list. Empty: any namespace the Pool
	// allows.
	// +optional
	AllowedNamespaces AllowedNamespaces `json:"allowedNamespaces,omitempty"`

	// ReclaimPolicy: Delete destroys the container in the store when this object is deleted, Retain keeps it.
	// +optional
	// +kubebuilder:default=Delete
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`
}

// ContainerStatus is copied from the management service's ContQuery.
type ContainerStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	UUID string `json:"uuid,omitempty"`
	// +optional
	PoolUUID string `json:"poolUUID,omitempty"`
	// State: "ready" while the store holds the container, "lost" when it no longer does: then only
	// uuid and poolUUID remain, the figures are cleared.
	// +optional
	State ContainerState `json:"state,omitempty"`
	// +optional
	ObjectClass string `json:"objectClass,omitempty"`
	// +optional
	RedundancyFactor int32 `json:"redundancyFactor,omitempty"`
	// UsedBytes as the store counts them.
	// +optional
	UsedBytes int64 `json:"usedBytes,omitempty"`
	// Used, for people ("12MiB").
	// +optional
	Used string `json:"used,omitempty"`
	// +optional
	Snapshots int32 `json:"snapshots,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Container is a Peregrine container (POSIX namespace) in a pool.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=pcont,categories=peregrine
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolRef.name`
// +kubebuilder:printcolumn:name="Class",type=string,JSONPath=`.status.objectClass`
// +kubebuilder:printcolumn:name="Used",type=string,JSONPath=`.status.used`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Container struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ContainerSpec   `json:"spec"`
	Status ContainerStatus `json:"status,omitempty"`
}

// ContainerList is a list of Containers.
// +kubebuilder:object:root=true
type ContainerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Container `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Container{}, &ContainerList{})
}
