package csi

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/peregrine-storage/peregrine/internal/testengine"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

func TestParseAllowList(t *testing.T) {
	for _, c := range []struct {
		in      string
		any     bool
		entries []allowEntry
		bad     string
	}{
		{in: "", any: true},
		{in: " , ", any: true},
		{in: "*", any: true},
		{in: "team-a,*", any: true, entries: []allowEntry{{namespace: "team-a"}}},
		{in: "team-a", entries: []allowEntry{{namespace: "team-a"}}},
		{in: " team-a , team-b/trainer ", entries: []allowEntry{{namespace: "team-a"}, {namespace: "team-b", serviceAccount: "trainer"}}},
		{in: "team-a/", bad: `"team-a/"`},
		{in: "/trainer", bad: `"/trainer"`},
		{in: "a/b/c", bad: `"a/b/c"`},
		{in: "team a", bad: `"team a"`},
		{in: "team-*", bad: `"team-*"`},
	} {
		l, err := parseAllowList(c.in)
		if c.bad != "" {
			if err == nil || !strings.Contains(err.Error(), c.bad) {
				t.Errorf("parseAllowList(%q): error %v, want one naming %s", c.in, err, c.bad)
			}
			continue
		}
		if err != nil {
			t.Errorf("parseAllowList(%q): %v", c.in, err)
			continue
		}
		if l.any != c.any || len(l.entries) != len(c.entries) {
			t.Errorf("parseAllowList(%q) = %+v, want any=%v entries %+v", c.in, l, c.any, c.entries)
			continue
		}
		for i := range c.entries {
			if l.entries[i] != c.entries[i] {
				t.Errorf("parseAllowList(%q) entry %d = %+v, want %+v", c.in, i, l.entries[i], c.entries[i])
			}
		}
	}
}

func TestAllowListMatches(t *testing.T) {
	for _, c := range []struct {
		prop, ns, sa string
		namespace    bool // allowsNamespace(ns): a PVC of ns
		pod          bool // allowsPod(ns, sa)
	}{
		{prop: "", ns: "anyone", sa: "default", namespace: true, pod: true},
		{prop: "*", ns: "anyone", sa: "default", namespace: true, pod: true},
		{prop: "team-a", ns: "team-a", sa: "default", namespace: true, pod: true},
		{prop: "team-a", ns: "team-b", sa: "default"},
		{prop: "team-a", ns: "team-a-dev", sa: "default"},
		{prop: "team-a/trainer", ns: "team-a", sa: "trainer", namespace: true, pod: true},
		{prop: "team-a/trainer", ns: "team-a", sa: "default", namespace: true},
		{prop: "team-a/trainer", ns: "team-a", sa: "", namespace: true},
		{prop: "team-a/trainer", ns: "team-b", sa: "trainer"},
		{prop: "team-a/trainer,team-b", ns: "team-b", sa: "default", namespace: true, pod: true},
		{prop: "team-a/trainer,team-a/server", ns: "team-a", sa: "server", namespace: true, pod: true},
		{prop: "team-a,*", ns: "team-c", sa: "default", namespace: true, pod: true},
	} {
		l, err := parseAllowList(c.prop)
		if err != nil {
			t.Fatalf("%q: %v", c.prop, err)
		}
		if got := l.allowsNamespace(c.ns); got != c.namespace {
			t.Errorf("%q allowsNamespace(%q) = %v, want %v", c.prop, c.ns, got, c.namespace)
		}
		if got := l.allowsPod(c.ns, c.sa); got != c.pod {
			t.Errorf("%q allowsPod(%q, %q) = %v, want %v", c.prop, c.ns, c.sa, got, c.pod)
		}
	}
}

func TestCheckAllowed(t *testing.T) {
	restricted := map[string]string{propNamespaces: "team-a/trainer,team-b"}
	pvc := func(ns string) requester { return pvcRequester(map[string]string{paramPVCNamespace: ns}) }
	pod := func(ns, sa string) requester {
		return podRequester(map[string]string{ctxPodNamespace: ns, ctxServiceAccount: sa})
	}
	for _, c := range []struct {
		name  string
		props map[string]string
		who   requester
		code  codes.Code
		says  []string
	}{
		{name: "no property", props: nil, who: pvc("x"), code: codes.OK},
		{name: "no property, unknown PVC namespace", props: map[string]string{}, who: pvcRequester(nil), code: codes.OK},
		{name: "star, unknown pod", props: map[string]string{propNamespaces: "*"}, who: podRequester(nil), code: codes.OK},
		{name: "PVC of an allowed namespace", props: restricted, who: pvc("team-b"), code: codes.OK},
		{name: "PVC of a namespace with one allowed service account", props: restricted, who: pvc("team-a"), code: codes.OK},
		{name: "PVC of another namespace", props: restricted, who: pvc("team-c"), code: codes.PermissionDenied,
			says: []string{`namespace "team-c"`, `pool "tank"`, propNamespaces, "team-a/trainer,team-b"}},
		{name: "PVC namespace unknown", props: restricted, who: pvcRequester(map[string]string{}), code: codes.PermissionDenied,
			says: []string{`pool "tank"`, propNamespaces, "--extra-create-metadata"}},
		{name: "pod of the allowed service account", props: restricted, who: pod("team-a", "trainer"), code: codes.OK},
		{name: "pod of another service account", props: restricted, who: pod("team-a", "default"), code: codes.PermissionDenied,
			says: []string{`service account "default" of namespace "team-a"`, `pool "tank"`, propNamespaces}},
		{name: "pod of an allowed namespace", props: restricted, who: pod("team-b", "anyone"), code: codes.OK},
		{name: "pod namespace unknown", props: restricted, who: podRequester(map[string]string{}), code: codes.PermissionDenied,
			says: []string{"podInfoOnMount"}},
		{name: "malformed property", props: map[string]string{propNamespaces: "a/b/c"}, who: pvc("a"), code: codes.FailedPrecondition,
			says: []string{`pool "tank"`, propNamespaces, `"a/b/c"`}},
	} {
		err := checkAllowed(c.props, `pool "tank"`, c.who)
		if got := status.Code(err); got != c.code {
			t.Errorf("%s: code %v (%v), want %v", c.name, got, err, c.code)
			continue
		}
		for _, s := range c.says {
			if !strings.Contains(status.Convert(err).Message(), s) {
				t.Errorf("%s: %q does not say %q", c.name, status.Convert(err).Message(), s)
			}
		}
	}
}

// TestNamespacesOnARealEngine: a pool restricted to namespaces refuses to provision for a PVC of
// another one, and the node's check refuses pods of another namespace or service account; it
// asks the store each time, so that a change of the pool's or the container's property holds
// for the next mount; a clone may not carry a container's data to a namespace it refuses. The
// node's check talks to the store with a client certificate, as the node plugin does. Only the
// engine is needed (TestNamespacesThroughTheNode mounts through the whole driver).
func TestNamespacesOnARealEngine(t *testing.T) {
	dir, err := os.MkdirTemp("", "csi-ns-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sys, err := testengine.Start("nsacl", filepath.Join(dir, "engines"), 1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ms := sys.Mgmt()
	if _, err := ms.PoolCreate(ctx, &mgmtpb.PoolCreateReq{Label: "guarded", TotalSize: 256 << 20}); err != nil {
		t.Fatalf("pool create: %v", err)
	}
	node := ms
	if sys.ClientTLSDir != "" {
		conn, err := grpc.NewClient(sys.MgmtAddr, grpc.WithTransportCredentials(pki.Credentials(pki.DirSource(sys.ClientTLSDir))))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close() })
		node = mgmtpb.NewMgmtClient(conn)
	}
	ctrl := &ControllerServer{ms: ms}
	if _, err := ms.PoolSetProp(ctx, &mgmtpb.PoolSetPropReq{Id: "guarded", Props: map[string]string{propNamespaces: "team-a/trainer,team-b"}}); err != nil {
		t.Fatalf("pool set-prop: %v", err)
	}
	create := func(name, ns string, src *csipb.VolumeContentSource) (*csipb.Volume, error) {
		params := map[string]string{ParamPool: "guarded"}
		if ns != "" {
			params[paramPVCNamespace] = ns
		}
		resp, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, Parameters: params,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 16 << 20}, VolumeCapabilities: []*csipb.VolumeCapability{rwx},
			VolumeContentSource: src})
		return resp.GetVolume(), err
	}

	_, err = create("pvc-other", "team-c", nil)
	expectDenied(t, err, `volume "pvc-other"`, `namespace "team-c"`, `pool "guarded"`, propNamespaces, "team-a/trainer,team-b")
	_, err = create("pvc-unknown", "", nil)
	expectDenied(t, err, `pool "guarded"`, "--extra-create-metadata")
	vol, err := create("pvc-team-a", "team-a", nil)
	if err != nil {
		t.Fatalf("create for team-a: %v", err)
	}
	id, err := ParseVolumeID(vol.VolumeId)
	if err != nil {
		t.Fatal(err)
	}

	pod := func(ns, sa string) requester {
		return podRequester(map[string]string{ctxPodNamespace: ns, ctxServiceAccount: sa})
	}
	expectDenied(t, checkPodAccess(ctx, node, id, pod("team-a", "default")), `service account "default" of namespace "team-a"`, `pool "guarded"`)
	expectDenied(t, checkPodAccess(ctx, node, id, podRequester(nil)), "podInfoOnMount")
	if err := checkPodAccess(ctx, node, id, pod("team-a", "trainer")); err != nil {
		t.Fatalf("team-a/trainer: %v", err)
	}

	// The container's own list narrows the pool's, at the next check.
	if _, err := ms.ContSetProp(ctx, &mgmtpb.ContSetPropReq{Pool: id.Pool, Id: id.Cont, Props: map[string]string{propNamespaces: "team-b"}}); err != nil {
		t.Fatalf("container set-prop: %v", err)
	}
	expectDenied(t, checkPodAccess(ctx, node, id, pod("team-a", "trainer")), `namespace "team-a"`, "container", propNamespaces)
	if err := checkPodAccess(ctx, node, id, pod("team-b", "default")); err != nil {
		t.Fatalf("team-b: %v", err)
	}

	// A clone for team-a of a container that allows team-b only is refused.
	_, err = create("pvc-clone", "team-a", &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{
		Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: vol.VolumeId}}})
	expectDenied(t, err, "source volume", `namespace "team-a"`, propNamespaces)

	// Lifting the pool's restriction ("*") lets any namespace provision.
	if _, err := ms.PoolSetProp(ctx, &mgmtpb.PoolSetPropReq{Id: "guarded", Props: map[string]string{propNamespaces: "*"}}); err != nil {
		t.Fatalf("pool set-prop: %v", err)
	}
	if _, err := create("pvc-anyone", "team-c", nil); err != nil {
		t.Fatalf("create for team-c once the pool allows any namespace: %v", err)
	}
}

// TestNamespacesThroughTheNode: NodePublishVolume of the whole driver refuses a pod its pool does
// not allow, before anything is mounted, and mounts one it allows.
func TestNamespacesThroughTheNode(t *testing.T) {
	dut := startDriver(t, 1, "guarded", 512<<20)
	c := dial(t, dut)
	ctx := context.Background()
	if _, err := dut.sys.Mgmt().PoolSetProp(ctx, &mgmtpb.PoolSetPropReq{Id: "guarded", Props: map[string]string{propNamespaces: "team-a/trainer"}}); err != nil {
		t.Fatalf("pool set-prop: %v", err)
	}
	vol := createVolume(t, c, "pvc-node", 16<<20, map[string]string{ParamPool: "guarded", paramPVCNamespace: "team-a"}, nil)
	staging := filepath.Join(dut.dir, "v", "staging")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
		VolumeCapability: rwx, VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatalf("stage: %v", err)
	}
	t.Cleanup(func() {
		_, _ = c.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	})
	publish := func(target, ns, sa string) error {
		vctx := map[string]string{ctxPodNamespace: ns, ctxServiceAccount: sa}
		for k, v := range vol.VolumeContext {
			vctx[k] = v
		}
		p := filepath.Join(dut.dir, "v", target)
		_, err := c.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
			TargetPath: p, VolumeCapability: rwx, VolumeContext: vctx})
		if err == nil {
			t.Cleanup(func() {
				_, _ = c.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: p})
			})
		}
		return err
	}
	expectDenied(t, publish("refused", "team-a", "default"), `service account "default" of namespace "team-a"`, `pool "guarded"`)
	if _, err := os.Stat(filepath.Join(dut.dir, "v", "refused")); !os.IsNotExist(err) {
		t.Errorf("a refused publish made its target path: %v", err)
	}
	if err := publish("allowed", "team-a", "trainer"); err != nil {
		t.Fatalf("publish for team-a/trainer: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dut.dir, "v", "allowed")); err != nil {
		t.Errorf("published target: %v", err)
	}
}

func expectDenied(t *testing.T, err error, says ...string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("got %v, want PermissionDenied", err)
	}
	for _, s := range says {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Errorf("%q does not say %q", status.Convert(err).Message(), s)
		}
	}
}

// TestOwnCredential: a container open of the node asks for a read-only handle as the node's user.
func TestOwnCredential(t *testing.T) {
	req := &mgmtpb.ContQueryReq{Pool: "p", Id: "c"}
	withOwnCredential(req)
	name := "root"
	if os.Geteuid() != 0 {
		name = strconv.Itoa(os.Geteuid())
	}
	if !req.ReadOnly {
		t.Errorf("%v: read_only not set", req)
	}
	if req.Cred.GetUser() != name || req.Cred.GetUid() != uint32(os.Geteuid()) {
		t.Errorf("cred %v, want user %q uid %d", req.Cred, name, os.Geteuid())
	}
	if len(req.Cred.GetGroups()) != 1 || req.Cred.GetGroups()[0] == "" {
		t.Errorf("cred.groups %v, want the primary group", req.Cred.GetGroups())
	}
}
