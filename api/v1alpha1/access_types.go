package v1alpha1

import "strings"

// Store properties the access fields of Pools and Containers set (docs/access-control.md).
const (
	// PropACL is the ACL of a pool or container.
	PropACL = "acl"
	// PropOwner and PropGroup are its owning user and group ("name@").
	PropOwner = "owner"
	PropGroup = "group"
	// PropAllowedNamespaces lists the Kubernetes namespaces ("ns") and service accounts
	// ("ns/sa"), separated by commas, whose PVCs and pods the CSI driver lets use the pool or
	// container; absent, empty or "*": any.
	PropAllowedNamespaces = "user.peregrine.io/namespaces"
	// AnyNamespace is the value of PropAllowedNamespaces that allows every namespace.
	AnyNamespace = "*"
)

// ACL is the store's access control list of a pool or container: entries separated by commas,
// each A:<flags>:<principal>:<perms>. flags is empty, or G when the principal is a group;
// principal is OWNER@, GROUP@ (with G), EVERYONE@, or a user or group name followed by @; perms
// is one or more of r (read), w (write) and a (administer), each at most once. The engine checks
// it again (at most 64 entries, one per principal) and answers InvalidArgument naming a bad
// entry, which the Ready condition shows.
// +kubebuilder:validation:MaxLength=4096
// +kubebuilder:validation:XValidation:rule="self.matches('^A:G?:[A-Za-z0-9._$-]+@:[rwa]+(,A:G?:[A-Za-z0-9._$-]+@:[rwa]+)*$')",message="want entries A:<flags>:<principal>:<perms> separated by commas: flags empty or G (group), principal OWNER@, GROUP@, EVERYONE@ or a name followed by @, perms one or more of r, w, a (e.g. A::OWNER@:rwa,A:G:GROUP@:rw,A::EVERYONE@:r)"
// +kubebuilder:validation:XValidation:rule="!self.matches('(^|,)A::GROUP@:') && !self.matches('(^|,)A:G:(OWNER|EVERYONE)@:')",message="GROUP@ takes the flag G (A:G:GROUP@:...); OWNER@ and EVERYONE@ take none (A::OWNER@:...)"
// +kubebuilder:validation:XValidation:rule="!self.matches(':[rwa]*(r[rwa]*r|w[rwa]*w|a[rwa]*a)[rwa]*(,|$)')",message="an entry names a permission twice (perms: each of r, w, a at most once)"
type ACL string

// Principal is a user or group of the store: a name (letters, digits, '.', '_', '-', '$'; a
// decimal name is that uid or gid) followed by @ ("alice@", "staff@").
// +kubebuilder:validation:MaxLength=256
// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._$-]+@$`
type Principal string

// AllowedNamespaces are Kubernetes namespaces ("team-a": every service account of it) and service
// accounts ("team-a/trainer"). Empty: any namespace.
// +kubebuilder:validation:MaxItems=64
// +listType=set
type AllowedNamespaces []NamespaceOrServiceAccount

// NamespaceOrServiceAccount is a namespace (a DNS-1123 label) or a service account of one,
// "namespace/name".
// +kubebuilder:validation:MaxLength=317
// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(/[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$`
type NamespaceOrServiceAccount string

// Property is the value of PropAllowedNamespaces for the list: its entries joined by commas, ""
// when it is empty.
func (a AllowedNamespaces) Property() string {
	s := make([]string, len(a))
	for i, n := range a {
		s[i] = string(n)
	}
	return strings.Join(s, ",")
}
