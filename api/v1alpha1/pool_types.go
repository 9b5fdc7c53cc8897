package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PoolSpec is a space reservation over the targets of a ServerSet's engines.
// +kubebuilder:validation:XValidation:rule="has(self.size) != (has(self.scmSize) || has(self.nvmeSize))",message="give either size or scmSize/nvmeSize"
// +kubebuilder:validation:XValidation:rule="has(self.scmSize) == has(self.nvmeSize)",message="scmSize and nvmeSize go together"
// +kubebuilder:validation:XValidation:rule="!has(self.tierRatio) || has(self.size)",message="tierRatio applies to size only",fieldPath=".tierRatio"
// +kubebuilder:validation:XValidation:rule="!has(self.allowedNamespaces) || !has(self.properties) || !('user.peregrine.io/namespaces' in self.properties)",message="give allowedNamespaces or properties[user.peregrine.io/namespaces], not both",fieldPath=".allowedNamespaces"
type PoolSpec struct {
	// ServerSetRef names the ServerSet (same namespace) whose engines hold the pool.
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="serverSetRef is immutable"
	ServerSetRef LocalObjectReference `json:"serverSetRef"`

	// Label of the pool in the store; defaults to the object's name.
	// +optional
	// +kubebuilder:validation:MaxLength=127
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._:-]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="label is immutable"
	Label string `json:"label,omitempty"`

	// Size in total, split over the tiers by tierRatio.
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="size is immutable"
	Size Size `json:"size,omitempty"`
	// TierRatio is the SCM fraction of size, a decimal between 0 and 1 ("0.06" when unset).
	// +optional
	// +kubebuilder:validation:Pattern=`^0?\.[0-9]*[1-9][0-9]*$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="tierRatio is immutable"
	TierRatio string `json:"tierRatio,omitempty"`
	// ScmSize per pool (with nvmeSize, instead of size).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="scmSize is immutable"
	ScmSize Size `json:"scmSize,omitempty"`
	// NvmeSize per pool (with scmSize, instead of size).
	// +optional
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="nvmeSize is immutable"
	NvmeSize Size `json:"nvmeSize,omitempty"`

	// RedundancyFactor: how many engine failures the pool's containers may be asked to survive.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=4
	RedundancyFactor *int32 `json:"redundancyFactor,omitempty"`

	// ACL of the pool in the store (its property acl): who may connect to it and what they may
	// do. Entries separated by commas, each A:<flags>:<principal>:<perms>: flags empty, or G for a
	// group principal; principal OWNER@, GROUP@ (flag G), EVERYONE@, or a user or group name
	// followed by @; perms one or more of r (read), w (write), a (administer). Example:
	// "A::OWNER@:rwa,A:G:GROUP@:rw,A::EVERYONE@:r". Unset: the store's default ACL.
	// +optional
	ACL ACL `json:"acl,omitempty"`

	// Owner of the pool in the store (property owner): a user name followed by @ ("alice@").
	// Unset: the creator's identity (root@ for the operator).
	// +optional
	Owner Principal `json:"owner,omitempty"`
	// Group owning the pool in the store (property group): a group name followed by @ ("staff@").
	// Unset: the creator's group (root@ for the operator).
	// +optional
	Group Principal `json:"group,omitempty"`

	// AllowedNamespaces lists the Kubernetes namespaces whose PVCs and pods may use the pool
	// through the CSI driver (property user.peregrine.io/namespaces): an entry "team-a" allows
	// every service account of the namespace, "team-a/trainer" only that service account. Empty:
	// any namespace. The CSI driver refuses to provision a volume in the pool for a PVC of
	// another namespace, and to mount one of its volumes into a pod of another namespace or
	// service account.
	// +optional
	AllowedNamespaces AllowedNamespaces `json:"allowedNamespaces,omitempty"`

	// Properties are user properties; keys start with "user.".
	// +optional
	// +kubebuilder:validation:XValidation:rule="self.all(k, k.startsWith('user.'))",message="property keys must start with 'user.'"
	Properties map[string]string `json:"properties,omitempty"`

	// ReclaimPolicy: Delete destroys the pool in the store when this object is deleted, Retain keeps it.
	// +optional
	// +kubebuilder:default=Delete
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`
}

// PoolStatus is copied from the management service's PoolQuery.
type PoolStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// UUID of the pool in the store.
	// +optional
	UUID string `json:"uuid,omitempty"`
	// Label of the pool in the store.
	// +optional
	Label string `json:"label,omitempty"`
	// State as the store reports it ("ready", "degraded": targets down, "reintegrating": targets
	// back and being brought up to date), or "lost" when the management service
	// no longer has the pool: then only uuid and label remain, the figures are cleared.
	// +optional
	State PoolState `json:"state,omitempty"`
	// MapVersion of the pool map.
	// +optional
	MapVersion int64 `json:"mapVersion,omitempty"`
	// +optional
	Ranks []int32 `json:"ranks,omitempty"`
	// +optional
	TotalTargets int32 `json:"totalTargets,omitempty"`
	// DisabledTargets counts the pool's targets that are excluded (down, or down and out): their
	// engines stopped answering and their shards are served around.
	// +optional
	DisabledTargets int32 `json:"disabledTargets,omitempty"`
	// ReintegratingTargets counts the pool's targets that are back and being brought up to date:
	// they take writes and serve no reads yet.
	// +optional
	ReintegratingTargets int32 `json:"reintegratingTargets,omitempty"`
	// RanksOut lists the ranks whose targets in this pool are not up-and-in, with their state.
	// +optional
	// +listType=map
	// +listMapKey=rank
	RanksOut []RankTargetState `json:"ranksOut,omitempty"`
	// Tiers with total and free bytes.
	// +optional
	Tiers []TierStatus `json:"tiers,omitempty"`
	// Size is the total over tiers, for people ("1.0GiB").
	// +optional
	Size string `json:"size,omitempty"`
	// Free is the free space over tiers, for people.
	// +optional
	Free string `json:"free,omitempty"`
	// Containers in the pool, as the store counts them.
	// +optional
	Containers int32 `json:"containers,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// TargetState is the state of a rank's targets in a pool map, other than up-and-in.
// +kubebuilder:validation:Enum=Down;Reintegrating;DownOut
type TargetState string

const (
	// TargetDown: excluded, the engine stopped answering; its shards are served around.
	TargetDown TargetState = "Down"
	// TargetReintegrating: the engine is back and its targets are being brought up to date; they
	// take writes and serve no reads.
	TargetReintegrating TargetState = "Reintegrating"
	// TargetDownOut: excluded and rebuilt elsewhere.
	TargetDownOut TargetState = "DownOut"
)

// RankTargetState is the state of one rank's targets in a pool.
type RankTargetState struct {
	Rank  int32       `json:"rank"`
	State TargetState `json:"state"`
}

// Pool is a Peregrine pool.
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ppool,categories=peregrine
// +kubebuilder:printcolumn:name="Size",type=string,JSONPath=`.status.size`
// +kubebuilder:printcolumn:name="Free",type=string,JSONPath=`.status.free`
// +kubebuilder:printcolumn:name="State",type=string,JSONPath=`.status.state`
// +kubebuilder:printcolumn:name="Disabled",type=integer,JSONPath=`.status.disabledTargets`,description="Targets excluded (down)",priority=1
// +kubebuilder:printcolumn:name="Reintegrating",type=integer,JSONPath=`.status.reintegratingTargets`,description="Targets back and being brought up to date",priority=1
// +kubebuilder:printcolumn:name="UUID",type=string,JSONPath=`.status.uuid`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Pool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   PoolSpec   `json:"spec"`
	Status PoolStatus `json:"status,omitempty"`
}

// PoolList is a list of Pools.
// +kubebuilder:object:root=true
type PoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Pool `json:"items"`
}

func init() {
	SchemeBuilder.Register(&Pool{}, &PoolList{})
}
