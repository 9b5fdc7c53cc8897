package csi

// Which Kubernetes namespaces may use a pool or a container through the driver: the property
// user.peregrine.io/namespaces of each (the Pool's and Container's spec.allowedNamespaces set it;
// docs/access-control.md). The controller checks the PVC's namespace against the pool before it
// provisions a volume (and against the source container of a clone); the node checks the pod's
// namespace and service account against the pool and the container before every publish, asking
// the management service each time, so that a change of the property holds for the next mount.
// Mounts already made stay: the property governs who gets a volume, the store's ACL what a
// mount may do.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// Keys the sidecars and the kubelet add: the PVC's namespace in CreateVolume's parameters (the
// external-provisioner's --extra-create-metadata), the pod's namespace and service account in
// NodePublishVolume's volume context (the CSIDriver's podInfoOnMount: true).
const (
	paramPVCNamespace = "csi.storage.k8s.io/pvc/namespace"
	ctxPodNamespace   = "csi.storage.k8s.io/pod.namespace"
	ctxServiceAccount = "csi.storage.k8s.io/serviceAccount.name"
)

// propNamespaces is the property of a pool or container listing who may use it.
const propNamespaces = storagev1.PropAllowedNamespaces

// requester is who asks for a volume: a PVC's namespace (provisioning), or a pod's namespace and
// service account (publishing, and provisioning an inline volume). known is false when the CO
// did not say (the sidecar or the CSIDriver object lacks the option): then only an unrestricted
// pool or container serves it.
type requester struct {
	namespace      string
	serviceAccount string
	known          bool
	// pod: entries naming a service account admit only that one; for a PVC they admit its
	// namespace (each pod is checked when it mounts).
	pod bool
	// missing says what to configure so that the CO says who asks.
	missing string
}

func (r requester) String() string {
	if r.serviceAccount != "" {
		return fmt.Sprintf("service account %q of namespace %q", r.serviceAccount, r.namespace)
	}
	return fmt.Sprintf("namespace %q", r.namespace)
}

// pvcRequester reads the PVC's namespace from CreateVolume's parameters.
func pvcRequester(params map[string]string) requester {
	ns := params[paramPVCNamespace]
	return requester{namespace: ns, known: ns != "",
		missing: "the request names no PVC namespace (" + paramPVCNamespace + "): the csi-provisioner sidecar needs --extra-create-metadata"}
}

// podRequester reads the pod's namespace and service account from a volume context.
func podRequester(vctx map[string]string) requester {
	ns := vctx[ctxPodNamespace]
	return requester{namespace: ns, serviceAccount: vctx[ctxServiceAccount], known: ns != "", pod: true,
		missing: "the request names no pod namespace (" + ctxPodNamespace + "): the CSIDriver object " + DriverName + " needs podInfoOnMount: true"}
}

// allowEntry is one entry of the property: a namespace, and a service account of it ("" for all).
type allowEntry struct {
	namespace      string
	serviceAccount string
}

// allowList is the parsed property; nil entries with any false allows nobody (never parsed so).
type allowList struct {
	any     bool
	entries []allowEntry
}

// parseAllowList parses the property's value: entries separated by commas, each "*", "ns" or
// "ns/sa"; blanks around entries are ignored. An absent or empty value, or one with "*", allows
// any namespace. A malformed entry is an error naming it: the driver then refuses rather than
// guess.
func parseAllowList(v string) (allowList, error) {
	var l allowList
	for _, e := range strings.Split(v, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case e == storagev1.AnyNamespace:
			l.any = true
			continue
		}
		ns, sa, hasSA := strings.Cut(e, "/")
		if ns == "" || (hasSA && (sa == "" || strings.Contains(sa, "/"))) || strings.ContainsAny(e, " \t*") {
			return allowList{}, fmt.Errorf("entry %q: want a namespace, namespace/serviceaccount, or *", e)
		}
		l.entries = append(l.entries, allowEntry{namespace: ns, serviceAccount: sa})
	}
	if len(l.entries) == 0 {
		l.any = true
	}
	return l, nil
}

// allowsNamespace reports whether some service account of namespace ns may use it: provisioning
// for a PVC of ns (its pods are checked one by one when they mount).
func (l allowList) allowsNamespace(ns string) bool {
	if l.any {
		return true
	}
	for _, e := range l.entries {
		if e.namespace == ns {
			return true
		}
	}
	return false
}

// allowsPod reports whether a pod of namespace ns running as service account sa may use it.
func (l allowList) allowsPod(ns, sa string) bool {
	if l.any {
		return true
	}
	for _, e := range l.entries {
		if e.namespace == ns && (e.serviceAccount == "" || e.serviceAccount == sa) {
			return true
		}
	}
	return false
}

// checkAllowed checks who against the property of one pool or container (what names it, for
// messages: `pool "tank"`): PermissionDenied naming who, what and the property when it refuses.
func checkAllowed(props map[string]string, what string, who requester) error {
	v := props[propNamespaces]
	l, err := parseAllowList(v)
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "%s: property %s=%q: %v", what, propNamespaces, v, err)
	}
	if l.any {
		return nil
	}
	if !who.known {
		return status.Errorf(codes.PermissionDenied, "%s is restricted to the namespaces %s (property %s) and %s",
			what, v, propNamespaces, who.missing)
	}
	ok := l.allowsNamespace(who.namespace)
	if who.pod {
		ok = l.allowsPod(who.namespace, who.serviceAccount)
	}
	if !ok {
		return status.Errorf(codes.PermissionDenied, "%s may not use %s: its property %s allows only %s",
			who, what, propNamespaces, v)
	}
	return nil
}

// checkPodAccess asks the management service for the properties of a volume's pool and container
// and checks the pod against both.
func checkPodAccess(ctx context.Context, ms mgmtpb.MgmtClient, id VolumeID, who requester) error {
	pool, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: id.Pool})
	if err != nil {
		return storeStatus(err, "volume %s: pool %q (checking the namespaces allowed to use it)", id, id.Pool)
	}
	if err := checkAllowed(pool.Props, fmt.Sprintf("pool %q", pool.Label), who); err != nil {
		return err
	}
	creq := &mgmtpb.ContQueryReq{Pool: pool.Uuid, Id: id.Cont}
	withOwnCredential(creq)
	cont, err := ms.ContQuery(ctx, creq)
	if err != nil {
		return storeStatus(err, "volume %s: container %q (checking the namespaces allowed to use it)", id, id.Cont)
	}
	return checkAllowed(cont.Props, fmt.Sprintf("container %q of pool %q", cont.Label, pool.Label), who)
}

// withOwnCredential asks, in a container open (ContQuery), for a read-only handle as the node
// plugin's own user (the user its FUSE daemons act as): a caller with a client certificate must
// name one (docs/access-control.md, "Who the caller is"), and the node only reads the
// container's properties.
func withOwnCredential(r *mgmtpb.ContQueryReq) {
	uid, gid := uint32(os.Geteuid()), uint32(os.Getegid())
	name := func(id uint32) string {
		if id == 0 {
			return "root"
		}
		return strconv.FormatUint(uint64(id), 10)
	}
	r.ReadOnly = true
	r.Cred = &mgmtpb.Credential{Uid: uid, Gid: gid, User: name(uid), Groups: []string{name(gid)}}
}
