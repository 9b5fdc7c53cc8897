package csi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/peregrine-storage/peregrine/internal/testengine"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// ntEnv is one test's engines (pool "p" with the given containers) and directories.
type ntEnv struct {
	sys     *testengine.System
	root    string
	fuseBin string
}

// ntStart skips without FUSE, starts one engine, creates pool p and the containers, and
// registers the clean-up of every daemon and mount under the test's directory.
func ntStart(t *testing.T, conts ...string) *ntEnv {
	t.Helper()
	if err := testengine.CheckFuse(); err != nil {
		t.Skipf("these tests make real FUSE mounts: %v", err)
	}
	fuseBin, err := testengine.Bin("peregrine-fuse")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	// Two cores: no busy polling in engines or clients.
	t.Setenv("PEREGRINE_VOS_POLL_US", "0")
	t.Setenv("PEREGRINE_SHM_SPIN_US", "0")
	sys, err := testengine.Start("csinode", filepath.Join(root, "engines"), 1, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Stop)
	t.Cleanup(func() { ntCleanup(t, root) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := sys.Mgmt().PoolCreate(ctx, &mgmtpb.PoolCreateReq{Label: "p", TotalSize: 256 << 20}); err != nil {
		t.Fatal(err)
	}
	for _, c := range conts {
		if _, err := sys.Mgmt().ContCreate(ctx, &mgmtpb.ContCreateReq{Pool: "p", Label: c}); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"staging", "pods"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return &ntEnv{sys: sys, root: root, fuseBin: fuseBin}
}

// ntCleanup kills the daemons recorded under root and lazily unmounts everything below it.
func ntCleanup(t *testing.T, root string) {
	files, _ := filepath.Glob(filepath.Join(root, "state*", "volumes", "*.json"))
	for _, f := range files {
		var st volState
		if b, err := os.ReadFile(f); err == nil && json.Unmarshal(b, &st) == nil && st.Pid > 0 && procAlive(st.Pid, st.PidStart) {
			_ = syscall.Kill(st.Pid, syscall.SIGKILL)
		}
	}
	ms, _ := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
	sort.Slice(ms, func(i, j int) bool { return len(ms[i].Mountpoint) > len(ms[j].Mountpoint) })
	for _, m := range ms {
		t.Logf("cleanup: detaching %s (%s)", m.Mountpoint, m.FSType)
		_ = syscall.Unmount(m.Mountpoint, syscall.MNT_DETACH)
	}
}

func (e *ntEnv) config() NodeConfig {
	// Role client, as the node plugin's Secret: mounts are what it may do.
	return NodeConfig{NodeID: "node-1", MgmtAddr: e.sys.MgmtAddr, FuseBin: e.fuseBin, StateDir: filepath.Join(e.root, "state"),
		TLSDir: e.sys.ClientTLSDir}
}

func (e *ntEnv) node(t *testing.T) *NodeServer {
	t.Helper()
	ns, err := NewNodeServer(e.config())
	if err != nil {
		t.Fatal(err)
	}
	return ns
}

func (e *ntEnv) path(p ...string) string { return filepath.Join(append([]string{e.root}, p...)...) }

// ntMountsUnder lists the mounts below root (none must be left by the driver).
func ntMountsUnder(t *testing.T, root string) []string {
	t.Helper()
	ms, err := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, m.Mountpoint+" ("+m.FSType+")")
	}
	return out
}

func ntMounted(t *testing.T, p string) bool {
	t.Helper()
	ms, err := mountsAt(canonical(p))
	if err != nil {
		t.Fatal(err)
	}
	return len(ms) > 0
}

func ntCap(mode csipb.VolumeCapability_AccessMode_Mode, flags ...string) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{MountFlags: flags}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}
}

var ntRW = ntCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

func ntCode(t *testing.T, err error, want codes.Code, mention ...string) {
	t.Helper()
	if status.Code(err) != want {
		t.Fatalf("got %v, want code %v", err, want)
	}
	for _, m := range mention {
		if !strings.Contains(err.Error(), m) {
			t.Fatalf("error %q does not mention %q", err, m)
		}
	}
}

func ntStage(t *testing.T, ns *NodeServer, id, staging string, c *csipb.VolumeCapability, vctx map[string]string) {
	t.Helper()
	if _, err := ns.NodeStageVolume(context.Background(), &csipb.NodeStageVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, VolumeCapability: c, VolumeContext: vctx,
	}); err != nil {
		t.Fatalf("stage %s: %v", id, err)
	}
}

func ntPublish(t *testing.T, ns *NodeServer, id, staging, target string, ro bool) {
	t.Helper()
	if _, err := ns.NodePublishVolume(context.Background(), &csipb.NodePublishVolumeRequest{
		VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: ntRW, Readonly: ro,
	}); err != nil {
		t.Fatalf("publish %s on %s: %v", id, target, err)
	}
}

func ntUnpublish(t *testing.T, ns *NodeServer, id, target string) {
	t.Helper()
	if _, err := ns.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("unpublish %s from %s: %v", id, target, err)
	}
}

func ntUnstage(t *testing.T, ns *NodeServer, id, staging string) {
	t.Helper()
	if _, err := ns.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage %s from %s: %v", id, staging, err)
	}
}

func ntStats(t *testing.T, ns *NodeServer, id, p string) *csipb.NodeGetVolumeStatsResponse {
	t.Helper()
	r, err := ns.NodeGetVolumeStats(context.Background(), &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: p})
	if err != nil {
		t.Fatalf("stats of %s at %s: %v", id, p, err)
	}
	return r
}

func ntDaemon(t *testing.T, ns *NodeServer, id string) *daemon {
	t.Helper()
	v := ns.getVolume(id)
	if v == nil || v.d == nil {
		t.Fatalf("volume %s has no daemon", id)
	}
	return v.d
}

func ntKill9(t *testing.T, d *daemon) {
	t.Helper()
	if err := syscall.Kill(d.pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !d.waitExit(10 * time.Second) {
		t.Fatalf("daemon %d survives SIGKILL", d.pid)
	}
}

func ntNoMountsLeft(t *testing.T, e *ntEnv) {
	t.Helper()
	if left := ntMountsUnder(t, e.root); len(left) > 0 {
		t.Fatalf("mounts left behind: %v", left)
	}
}

// Stage, publish read-write and read-only, data through one target read through another,
// EROFS through the read-only one, stats, idempotency of every call, options from the volume
// context and the access mode, and missing pools or containers.
func TestNodeStagePublish(t *testing.T) {
	e := ntStart(t, "c", "c2")
	ns := e.node(t)
	ctx := context.Background()
	const id = "p/c"
	staging := e.path("staging", "c")
	ntStage(t, ns, id, staging, ntRW, nil)
	if !ntMounted(t, staging) {
		t.Fatal("staging path is not mounted")
	}
	pid := ntDaemon(t, ns, id).pid
	// The node's default transport, auto: FUSE over io_uring where the kernel has it, its switch
	// turned on by the plugin.
	wantTransport := "/dev/fuse)"
	if _, err := os.Stat(fuseIoUringSwitch); err == nil {
		wantTransport = "FUSE over io_uring)"
		if b, err := os.ReadFile(fuseIoUringSwitch); err != nil || strings.TrimSpace(string(b)) != "Y" {
			t.Fatalf("%s after an auto stage: %q, %v", fuseIoUringSwitch, b, err)
		}
	}
	ntTransport(t, ns, id, "--io-uring auto", wantTransport)
	ntStage(t, ns, id, staging, ntRW, nil) // idempotent
	if got := ntDaemon(t, ns, id).pid; got != pid {
		t.Fatalf("restaging started another daemon (%d, was %d)", got, pid)
	}
	_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
		VolumeCapability: ntRW, VolumeContext: map[string]string{"threads": "2"}})
	ntCode(t, err, codes.AlreadyExists)

	a, b, c := e.path("pods", "a", "mount"), e.path("pods", "b", "mount"), e.path("pods", "c", "mount")
	for _, d := range []string{a, b, c} {
		if err := os.MkdirAll(filepath.Dir(d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ntPublish(t, ns, id, staging, a, false)
	ntPublish(t, ns, id, staging, b, true)
	ntPublish(t, ns, id, staging, c, false)
	ntPublish(t, ns, id, staging, a, false) // idempotent
	_, err = ns.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: a,
		VolumeCapability: ntRW, Readonly: true})
	ntCode(t, err, codes.AlreadyExists)

	data := []byte("written through target a\n")
	if err := os.WriteFile(filepath.Join(a, "f"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{c, b, staging} {
		got, err := os.ReadFile(filepath.Join(d, "f"))
		if err != nil || string(got) != string(data) {
			t.Fatalf("read through %s: %q, %v", d, got, err)
		}
	}
	if err := os.WriteFile(filepath.Join(b, "g"), data, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write through the read-only target: %v, want EROFS", err)
	}
	if err := os.Mkdir(filepath.Join(b, "d"), 0o755); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("mkdir through the read-only target: %v, want EROFS", err)
	}

	st := ntStats(t, ns, id, a)
	if st.VolumeCondition.GetAbnormal() {
		t.Fatalf("abnormal: %s", st.VolumeCondition.GetMessage())
	}
	if len(st.Usage) != 2 || st.Usage[0].Unit != csipb.VolumeUsage_BYTES || st.Usage[0].Total <= 0 || st.Usage[1].Unit != csipb.VolumeUsage_INODES {
		t.Fatalf("usage: %v", st.Usage)
	}
	t.Logf("stats: %v; %s", st.Usage, st.VolumeCondition.GetMessage())
	if st := ntStats(t, ns, id, staging); st.VolumeCondition.GetAbnormal() {
		t.Fatalf("staging abnormal: %s", st.VolumeCondition.GetMessage())
	}
	_, err = ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: "some/path"})
	ntCode(t, err, codes.NotFound)
	_, err = ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "p/other", VolumePath: a})
	ntCode(t, err, codes.NotFound)
	r, err := ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: a, CapacityRange: &csipb.CapacityRange{RequiredBytes: 1 << 30}})
	if err != nil || r.CapacityBytes != 1<<30 {
		t.Fatalf("expand: %v, %v", r, err)
	}

	for _, d := range []string{a, a, b, c, e.path("pods", "nope", "mount")} {
		ntUnpublish(t, ns, id, d)
		if _, err := os.Lstat(d); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("target %s still there after unpublish: %v", d, err)
		}
	}
	if n := len(ns.getVolume(id).st.Targets); n != 0 {
		t.Fatalf("%d targets still recorded", n)
	}
	d := ntDaemon(t, ns, id)
	ntUnstage(t, ns, id, staging)
	ntUnstage(t, ns, id, staging)
	ntUnstage(t, ns, id, e.path("staging", "nope"))
	if d.alive() {
		t.Fatal("daemon still running after unstage")
	}
	if ntMounted(t, staging) {
		t.Fatal("staging still mounted after unstage")
	}
	if _, err := os.Stat(ns.statePath(id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state file left: %v", err)
	}

	// A fresh container cannot be mounted read-only: nothing would make its file system.
	_, err = ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "p/c2", StagingTargetPath: e.path("staging", "c2"),
		VolumeCapability: ntCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY)})
	ntCode(t, err, codes.FailedPrecondition, "no file system")

	// A reader-only access mode and options from the volume context (c has a file system now).
	const id2 = "p/c"
	staging2 := e.path("staging", "c2")
	ntStage(t, ns, id2, staging2, ntCap(csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY),
		map[string]string{"threads": "2", "attrTimeout": "500ms", "dentryTimeout": "2", "dataCache": "off", "ioUring": "off", "csi.storage.k8s.io/pod.name": "x"})
	args := strings.Join(ns.getVolume(id2).st.Args, " ")
	for _, want := range []string{"--read-only", "--threads 2", "--attr-timeout 500ms", "--dentry-timeout 2", "--data-cache off", "--foreground"} {
		if !strings.Contains(args, want) {
			t.Fatalf("daemon args %q lack %q", args, want)
		}
	}
	ntTransport(t, ns, id2, "--io-uring off", "/dev/fuse)")
	if err := os.WriteFile(filepath.Join(staging2, "x"), data, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a read-only stage: %v, want EROFS", err)
	}
	t2 := e.path("pods", "d", "mount")
	_ = os.MkdirAll(filepath.Dir(t2), 0o755)
	ntPublish(t, ns, id2, staging2, t2, false)
	ntPublish(t, ns, id2, staging2, t2, false) // idempotent although the bind is read-only
	if err := os.WriteFile(filepath.Join(t2, "x"), data, 0o644); !errors.Is(err, syscall.EROFS) {
		t.Fatalf("write to a read-only volume's target: %v, want EROFS", err)
	}
	ntUnpublish(t, ns, id2, t2)
	ntUnstage(t, ns, id2, staging2)

	// Missing pool or container: NotFound, with the daemon's words, and nothing mounted.
	for _, bad := range []string{"p/nope", "nope/c"} {
		_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: bad, StagingTargetPath: e.path("staging", "bad"), VolumeCapability: ntRW})
		ntCode(t, err, codes.NotFound, "no such")
		t.Logf("%s: %v", bad, err)
	}
	ntNoMountsLeft(t, e)
}

// ntTransport: the volume's daemon got arg and its log says it mounted over transport.
func ntTransport(t *testing.T, ns *NodeServer, id, arg, transport string) {
	t.Helper()
	if args := strings.Join(ns.getVolume(id).st.Args, " "); !strings.Contains(args, arg) {
		t.Fatalf("daemon args %q lack %q", args, arg)
	}
	// The last start's line: the daemon logs it once the kernel's INIT is answered, which may
	// come after the mount that the stage waited for.
	var b []byte
	mounted := ""
	for deadline := time.Now().Add(10 * time.Second); mounted == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var err error
		if b, err = os.ReadFile(ns.logPath(id)); err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case strings.Contains(l, ": starting peregrine-fuse for volume "): // the plugin's line per start
				mounted = ""
			case strings.Contains(l, "peregrine-fuse: mounted "):
				mounted = l
			}
		}
	}
	if !strings.HasSuffix(mounted, transport) {
		t.Fatalf("the daemon's last mount line %q does not end in %q; log:\n%s", mounted, transport, b)
	}
}

// A daemon killed with SIGKILL: stats report the volume abnormal, unpublish and unstage still
// succeed and leave no mount behind.
func TestNodeDeadMount(t *testing.T) {
	e := ntStart(t, "c")
	ns := e.node(t)
	const id = "p/c"
	staging, target := e.path("staging", "c"), e.path("pods", "a", "mount")
	_ = os.MkdirAll(filepath.Dir(target), 0o755)
	ntStage(t, ns, id, staging, ntRW, nil)
	ntPublish(t, ns, id, staging, target, false)
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	ntKill9(t, ntDaemon(t, ns, id))
	if _, err := os.ReadFile(filepath.Join(target, "f")); !daemonGone(err) {
		t.Fatalf("read from a dead mount: %v, want ENOTCONN, ECONNABORTED or ECANCELED", err)
	}
	for _, p := range []string{target, staging} {
		st := ntStats(t, ns, id, p)
		if !st.VolumeCondition.GetAbnormal() || !strings.Contains(st.VolumeCondition.GetMessage(), "not running") {
			t.Fatalf("stats of %s: %v", p, st.VolumeCondition)
		}
		if len(st.Usage) != 2 {
			t.Fatalf("usage of an abnormal volume: %v", st.Usage)
		}
		t.Logf("%s: %s", p, st.VolumeCondition.GetMessage())
	}
	ntUnpublish(t, ns, id, target)
	ntUnpublish(t, ns, id, target)
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("target left: %v", err)
	}
	ntUnstage(t, ns, id, staging)
	ntUnstage(t, ns, id, staging)
	ntNoMountsLeft(t, e)
}

// A plugin restart with the daemon running: the new NodeServer adopts it (same pid) and a
// reader in another process never sees an error.
func TestNodeRestartReadopt(t *testing.T) {
	e := ntStart(t, "c")
	ns := e.node(t)
	const id = "p/c"
	staging, target := e.path("staging", "c"), e.path("pods", "a", "mount")
	_ = os.MkdirAll(filepath.Dir(target), 0o755)
	ntStage(t, ns, id, staging, ntRW, nil)
	ntPublish(t, ns, id, staging, target, false)
	file := filepath.Join(target, "data")
	if err := os.WriteFile(file, []byte(strings.Repeat("peregrine\n", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	reader := exec.Command("sh", "-c", `while :; do cat "$1" >/dev/null || exit 1; sleep 0.05; done`, "reader", file)
	reader.Dir = e.root
	if err := reader.Start(); err != nil {
		t.Fatal(err)
	}
	readerDone := make(chan error, 1)
	go func() { readerDone <- reader.Wait() }()
	t.Cleanup(func() { _ = reader.Process.Kill() })
	pid := ntDaemon(t, ns, id).pid
	time.Sleep(300 * time.Millisecond)

	// The plugin goes away; its daemon does not. While it is there, no other takes over.
	if _, err := NewNodeServer(e.config()); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("a second NodeServer on the same state directory: %v", err)
	}
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	ns = nil
	ns2 := e.node(t)
	d := ntDaemon(t, ns2, id)
	if d.pid != pid || !d.alive() {
		t.Fatalf("after the restart: daemon %d (alive %v), want the adopted %d", d.pid, d.alive(), pid)
	}
	if tg := ns2.getVolume(id).st.Targets; len(tg) != 1 {
		t.Fatalf("targets after the restart: %v", tg)
	}
	if st := ntStats(t, ns2, id, target); st.VolumeCondition.GetAbnormal() {
		t.Fatalf("abnormal after the restart: %s", st.VolumeCondition.GetMessage())
	}
	ntStage(t, ns2, id, staging, ntRW, nil)
	ntPublish(t, ns2, id, staging, target, false)
	if got := ntDaemon(t, ns2, id).pid; got != pid {
		t.Fatalf("stage/publish after the restart replaced the daemon (%d, was %d)", got, pid)
	}
	time.Sleep(time.Second)
	select {
	case err := <-readerDone:
		t.Fatalf("the reader failed across the restart: %v", err)
	default:
	}
	_ = reader.Process.Kill()
	if err := <-readerDone; err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("reader ended with %v, want killed by us", err)
	}
	ntUnpublish(t, ns2, id, target)
	ntUnstage(t, ns2, id, staging)
	if procAlive(pid, d.start) {
		t.Fatal("adopted daemon still running after unstage")
	}
	ntNoMountsLeft(t, e)
}

// A plugin restart after its daemon was killed: the new NodeServer remounts the volume (a new
// daemon), binds the recorded target again and forgets a target whose pod directory is gone.
func TestNodeRestartRemount(t *testing.T) {
	e := ntStart(t, "c")
	ns := e.node(t)
	const id = "p/c"
	staging, target, gone := e.path("staging", "c"), e.path("pods", "a", "mount"), e.path("pods", "gone", "mount")
	for _, p := range []string{target, gone} {
		_ = os.MkdirAll(filepath.Dir(p), 0o755)
	}
	ntStage(t, ns, id, staging, ntRW, map[string]string{"dataCache": "off"})
	ntPublish(t, ns, id, staging, target, false)
	ntPublish(t, ns, id, staging, gone, true)
	content := []byte("survives a dead daemon\n")
	if err := os.WriteFile(filepath.Join(target, "data"), content, 0o644); err != nil {
		t.Fatal(err)
	}
	old := ntDaemon(t, ns, id)
	ntKill9(t, old)
	if _, err := os.ReadFile(filepath.Join(target, "data")); !daemonGone(err) {
		t.Fatalf("read from a dead mount: %v, want ENOTCONN, ECONNABORTED or ECANCELED", err)
	}
	// The pod of the second target went away meanwhile.
	if err := syscall.Unmount(gone, syscall.MNT_DETACH); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Dir(gone)); err != nil {
		t.Fatal(err)
	}

	_ = ns.Close()
	ns = nil
	ns2 := e.node(t)
	d := ntDaemon(t, ns2, id)
	if d.pid == old.pid || !d.alive() {
		t.Fatalf("after the restart: daemon %d (alive %v), want a new one (old %d)", d.pid, d.alive(), old.pid)
	}
	got, err := os.ReadFile(filepath.Join(target, "data"))
	if err != nil || string(got) != string(content) {
		t.Fatalf("read through the target after the remount: %q, %v", got, err)
	}
	v := ns2.getVolume(id)
	if _, ok := v.st.Targets[canonical(target)]; !ok || len(v.st.Targets) != 1 {
		t.Fatalf("targets after the remount: %v", v.st.Targets)
	}
	if !strings.Contains(strings.Join(v.st.Args, " "), "--data-cache off") {
		t.Fatalf("remounted without the recorded options: %v", v.st.Args)
	}
	if _, err := os.Lstat(gone); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the gone pod's target was created again: %v", err)
	}
	if st := ntStats(t, ns2, id, target); st.VolumeCondition.GetAbnormal() {
		t.Fatalf("abnormal after the remount: %s", st.VolumeCondition.GetMessage())
	}
	ntUnpublish(t, ns2, id, target)
	ntUnstage(t, ns2, id, staging)
	ntNoMountsLeft(t, e)
}

// The node plugin as a separate process (TestNodePluginKilled): the test binary run again with
// PEREGRINE_CSI_NODE_HELPER=MGMT|FUSEBIN|STATEDIR|STAGING|TARGET|TLSDIR stages and publishes p/c,
// writes a file, prints the daemon's pid and waits to be killed.
func init() {
	h := os.Getenv("PEREGRINE_CSI_NODE_HELPER")
	if h == "" {
		return
	}
	a := strings.Split(h, "|")
	fail := func(err error) { fmt.Println("ERROR", err); os.Exit(1) }
	ns, err := NewNodeServer(NodeConfig{NodeID: "n1", MgmtAddr: a[0], FuseBin: a[1], StateDir: a[2], TLSDir: a[5]})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	if _, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: "p/c", StagingTargetPath: a[3], VolumeCapability: ntRW}); err != nil {
		fail(err)
	}
	if _, err := ns.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: "p/c", StagingTargetPath: a[3], TargetPath: a[4], VolumeCapability: ntRW}); err != nil {
		fail(err)
	}
	if err := os.WriteFile(filepath.Join(a[4], "data"), []byte("from the killed plugin"), 0o644); err != nil {
		fail(err)
	}
	fmt.Println("READY", ns.getVolume("p/c").d.pid)
	select {}
}

// The plugin process killed with SIGKILL: its daemon (own session, no parent-death signal)
// keeps serving, and a new NodeServer adopts it.
func TestNodePluginKilled(t *testing.T) {
	e := ntStart(t, "c")
	staging, target := e.path("staging", "c"), e.path("pods", "a", "mount")
	_ = os.MkdirAll(filepath.Dir(target), 0o755)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	plugin := exec.Command(exe, "-test.run=^$")
	plugin.Env = append(os.Environ(), "PEREGRINE_CSI_NODE_HELPER="+strings.Join([]string{e.sys.MgmtAddr, e.fuseBin, e.config().StateDir, staging, target, e.sys.ClientTLSDir}, "|"))
	plugin.Stderr = os.Stderr
	out, err := plugin.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := plugin.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = plugin.Process.Kill(); _ = plugin.Wait() })
	var word string
	var pid int
	if _, err := fmt.Fscan(out, &word, &pid); err != nil || word != "READY" {
		t.Fatalf("plugin process: %q %d %v", word, pid, err)
	}
	if err := plugin.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = plugin.Wait()
	time.Sleep(200 * time.Millisecond)
	if !procAlive(pid, 0) {
		t.Fatalf("daemon %d died with the plugin", pid)
	}
	if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "from the killed plugin" {
		t.Fatalf("read after the plugin died: %q, %v", b, err)
	}
	ns := e.node(t)
	if d := ntDaemon(t, ns, "p/c"); d.pid != pid || !d.alive() {
		t.Fatalf("new plugin: daemon %d, want the adopted %d", d.pid, pid)
	}
	ntUnpublish(t, ns, "p/c", target)
	ntUnstage(t, ns, "p/c", staging)
	if procAlive(pid, 0) {
		t.Fatal("adopted daemon still running after unstage")
	}
	ntNoMountsLeft(t, e)
}

// ntProvisioner makes inline volumes' containers in pool p.
type ntProvisioner struct {
	mgmt    mgmtpb.MgmtClient
	created []string
	deleted []VolumeID
}

func (p *ntProvisioner) CreateEphemeral(ctx context.Context, name string, attrs map[string]string) (VolumeID, error) {
	p.created = append(p.created, name)
	if _, err := p.mgmt.ContCreate(ctx, &mgmtpb.ContCreateReq{Pool: "p", Label: name}); err != nil && status.Code(err) != codes.AlreadyExists {
		return VolumeID{}, err
	}
	return VolumeID{Pool: "p", Cont: name}, nil
}

func (p *ntProvisioner) DeleteEphemeral(ctx context.Context, id VolumeID) error {
	p.deleted = append(p.deleted, id)
	_, err := p.mgmt.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: id.Pool, Id: id.Cont, Force: true})
	if status.Code(err) == codes.NotFound {
		return nil
	}
	return err
}

// An inline ephemeral volume: publish creates the container and mounts it privately,
// unpublish stops the daemon and deletes the container.
func TestNodeEphemeral(t *testing.T) {
	e := ntStart(t)
	prov := &ntProvisioner{mgmt: e.sys.Mgmt()}
	cfg := e.config()
	cfg.Ephemeral = prov
	ns, err := NewNodeServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const id = "csi-0123456789abcdef"
	target := e.path("pods", "a", "mount")
	_ = os.MkdirAll(filepath.Dir(target), 0o755)
	req := &csipb.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: ntRW,
		VolumeContext: map[string]string{ephemeralContextKey: "true", "csi.storage.k8s.io/pod.name": "pod", "dataCache": "off"}}

	bad := &csipb.NodePublishVolumeRequest{VolumeId: id, TargetPath: target, VolumeCapability: ntRW,
		VolumeContext: map[string]string{ephemeralContextKey: "true", "threads": "many"}}
	_, err = ns.NodePublishVolume(ctx, bad)
	ntCode(t, err, codes.InvalidArgument, "threads")
	if len(prov.created) != 0 {
		t.Fatal("a bad attribute created a container")
	}

	for i := 0; i < 2; i++ {
		if _, err := ns.NodePublishVolume(ctx, req); err != nil {
			t.Fatalf("publish #%d: %v", i, err)
		}
	}
	if len(prov.created) != 1 {
		t.Fatalf("containers created: %v", prov.created)
	}
	if err := os.WriteFile(filepath.Join(target, "f"), []byte("inline"), 0o644); err != nil {
		t.Fatal(err)
	}
	v := ns.getVolume(id)
	if got, err := os.ReadFile(filepath.Join(v.st.StagingPath, "f")); err != nil || string(got) != "inline" {
		t.Fatalf("read through the private mount: %q, %v", got, err)
	}
	if !strings.HasPrefix(v.st.StagingPath, canonical(cfg.StateDir)) {
		t.Fatalf("private staging %s is not under the state dir", v.st.StagingPath)
	}
	if st := ntStats(t, ns, id, target); st.VolumeCondition.GetAbnormal() {
		t.Fatalf("abnormal: %s", st.VolumeCondition.GetMessage())
	}
	d := v.d
	ntUnpublish(t, ns, id, target)
	if d.alive() {
		t.Fatal("inline volume's daemon still running after unpublish")
	}
	if len(prov.deleted) != 1 || prov.deleted[0] != (VolumeID{Pool: "p", Cont: id}) {
		t.Fatalf("containers deleted: %v", prov.deleted)
	}
	if _, err := e.sys.Mgmt().ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: "p", Id: id}); status.Code(err) != codes.NotFound {
		t.Fatalf("container still there: %v", err)
	}
	ntUnpublish(t, ns, id, target)
	if len(prov.deleted) != 1 || ns.getVolume(id) != nil {
		t.Fatalf("second unpublish: deleted %v, volume %v", prov.deleted, ns.getVolume(id))
	}
	ntNoMountsLeft(t, e)
}

// Argument checks as the CSI spec and csi-sanity want them, capabilities and node info; no
// mount is made.
func TestNodeValidation(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewNodeServer(NodeConfig{StateDir: t.TempDir(), FuseBin: sh}); err == nil {
		t.Fatal("NewNodeServer without a node ID")
	}
	if _, err := NewNodeServer(NodeConfig{NodeID: "n1", StateDir: t.TempDir(), FuseBin: sh, FuseIoUring: "sometimes"}); err == nil ||
		!strings.Contains(err.Error(), "want auto, on or off") {
		t.Fatalf("NewNodeServer with FUSE over io_uring %q: %v", "sometimes", err)
	}
	if ns, err := NewNodeServer(NodeConfig{NodeID: "n1", StateDir: t.TempDir(), FuseBin: sh, FuseIoUring: "OFF"}); err != nil || ns.cfg.FuseIoUring != IoUringOff {
		t.Fatalf("NewNodeServer with FUSE over io_uring %q: %v", "OFF", err)
	} else {
		ns.Close()
	}
	ns, err := NewNodeServer(NodeConfig{NodeID: "n1", FuseBin: sh, StateDir: t.TempDir(), MaxVolumes: 7,
		Topology: map[string]string{"topology.kubernetes.io/zone": "z1"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	block := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	noMode := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}}}
	ext4 := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}

	stage := func(id, path string, c *csipb.VolumeCapability, vctx map[string]string) error {
		_, err := ns.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: path, VolumeCapability: c, VolumeContext: vctx})
		return err
	}
	ntCode(t, stage("", staging, ntRW, nil), codes.InvalidArgument)
	ntCode(t, stage("p/c", "", ntRW, nil), codes.InvalidArgument)
	ntCode(t, stage("p/c", staging, nil, nil), codes.InvalidArgument)
	ntCode(t, stage("p/c", staging, block, nil), codes.InvalidArgument, "block")
	ntCode(t, stage("p/c", staging, noMode, nil), codes.InvalidArgument, "access mode")
	ntCode(t, stage("p/c", staging, ext4, nil), codes.InvalidArgument, "ext4")
	ntCode(t, stage("p/c", staging, ntCap(csipb.VolumeCapability_AccessMode_UNKNOWN), nil), codes.InvalidArgument)
	ntCode(t, stage("not-a-volume", staging, ntRW, nil), codes.NotFound)
	for key, val := range map[string]string{"threads": "0", "attrTimeout": "soon", "dentryTimeout": "-1", "dataCache": "maybe", "readOnly": "perhaps", "ioUring": "sometimes"} {
		ntCode(t, stage("p/c", staging, ntRW, map[string]string{key: val}), codes.InvalidArgument, key, val, "want")
	}
	ntCode(t, stage("p/c", staging, ntRW, map[string]string{"threads": "300"}), codes.InvalidArgument, "1 to 256")
	ntCode(t, stage("p/c", staging, ntRW, map[string]string{"dataCache": "x"}), codes.InvalidArgument, "on, off")
	for _, flag := range []string{"bogus", "threads=x", "attr-timeout=1d", "ro=1", "noexec"} {
		ntCode(t, stage("p/c", staging, ntCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, flag), nil), codes.InvalidArgument)
	}
	o, err := parseMountOpts(VolumeID{"p", "c"}, ntCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER, "threads=8,attr_timeout=2s", "data-cache=ON", "ro", "io_uring=OFF"),
		map[string]string{"threads": "2", "dentryTimeout": ".5", "pool": "ignored", "ioUring": "on"})
	if err != nil || o != (mountOpts{Pool: "p", Cont: "c", Threads: 8, AttrTimeout: "2s", DentryTimeout: ".5", DataCache: "on", ReadOnly: true, IoUring: IoUringOff}) {
		t.Fatalf("options: %+v, %v", o, err)
	}

	publish := func(r *csipb.NodePublishVolumeRequest) error { _, err := ns.NodePublishVolume(ctx, r); return err }
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{}), codes.InvalidArgument)
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "p/c"}), codes.InvalidArgument)
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "p/c", TargetPath: target}), codes.InvalidArgument)
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "p/c", TargetPath: target, VolumeCapability: block, StagingTargetPath: staging}), codes.InvalidArgument, "block")
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "p/c", TargetPath: target, VolumeCapability: ntRW}), codes.InvalidArgument, "staging")
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "p/c", TargetPath: target, VolumeCapability: ntRW, StagingTargetPath: staging}), codes.FailedPrecondition, "not staged")
	ntCode(t, publish(&csipb.NodePublishVolumeRequest{VolumeId: "csi-x", TargetPath: target, VolumeCapability: ntRW,
		VolumeContext: map[string]string{ephemeralContextKey: "true"}}), codes.FailedPrecondition, "ephemeral")
	if _, err := os.Lstat(target); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused publish created the target: %v", err)
	}

	_, err = ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{TargetPath: target})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "p/c"})
	ntCode(t, err, codes.InvalidArgument)
	if _, err := ns.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: "p/c", TargetPath: target}); err != nil {
		t.Fatalf("unpublish of nothing: %v", err)
	}
	_, err = ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{StagingTargetPath: staging})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "p/c"})
	ntCode(t, err, codes.InvalidArgument)
	if _, err := ns.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: "p/c", StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage of nothing: %v", err)
	}

	_, err = ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumePath: "some/path"})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "p/c"})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: "p/c", VolumePath: "some/path"})
	ntCode(t, err, codes.NotFound)
	_, err = ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumePath: target})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "p/c"})
	ntCode(t, err, codes.InvalidArgument)
	_, err = ns.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: "p/c", VolumePath: "some/path"})
	ntCode(t, err, codes.NotFound)

	caps, err := ns.NodeGetCapabilities(ctx, &csipb.NodeGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	have := map[csipb.NodeServiceCapability_RPC_Type]bool{}
	for _, c := range caps.Capabilities {
		have[c.GetRpc().GetType()] = true
	}
	for _, want := range []csipb.NodeServiceCapability_RPC_Type{csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS, csipb.NodeServiceCapability_RPC_VOLUME_CONDITION,
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER} {
		if !have[want] {
			t.Fatalf("capability %v missing", want)
		}
	}
	if have[csipb.NodeServiceCapability_RPC_EXPAND_VOLUME] || len(have) != 4 {
		t.Fatalf("capabilities: %v", have)
	}
	info, err := ns.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	seg := info.GetAccessibleTopology().GetSegments()
	if info.NodeId != "n1" || info.MaxVolumesPerNode != 7 || seg[TopologyNodeKey] != "n1" || seg["topology.kubernetes.io/zone"] != "z1" || len(seg) != 2 {
		t.Fatalf("node info: %v", info)
	}
	if err := ns.Probe(ctx); err != nil {
		t.Fatal(err)
	}
}

// FuseCgroup: the daemon is moved into the given cgroups (here cgroup v1 pids and cpuset
// hierarchies: a new cpuset has no CPUs until it is given its parent's); a path that is no
// cgroup is logged and does not fail the stage.
func TestNodeFuseCgroup(t *testing.T) {
	var hiers []string
	for _, h := range []string{"pids", "cpuset"} {
		var fs syscall.Statfs_t
		if err := syscall.Statfs("/sys/fs/cgroup/"+h, &fs); err == nil && fs.Type == 0x27e0eb { // CGROUP_SUPER_MAGIC
			hiers = append(hiers, h)
		}
	}
	if len(hiers) == 0 {
		t.Skip("no cgroup v1 pids or cpuset hierarchy to move daemons into")
	}
	e := ntStart(t, "c")
	name := fmt.Sprintf("peregrine-csi-test-%d", os.Getpid())
	var cgs []string
	for _, h := range hiers {
		cg := filepath.Join("/sys/fs/cgroup", h, name)
		cgs = append(cgs, cg)
		t.Cleanup(func() {
			if b, err := os.ReadFile(filepath.Join(cg, "cgroup.procs")); err == nil {
				for _, f := range strings.Fields(string(b)) {
					var pid int
					fmt.Sscan(f, &pid)
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			for i := 0; i < 100; i++ {
				if err := os.Remove(cg); err == nil || errors.Is(err, os.ErrNotExist) {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
			t.Errorf("cgroup %s left behind", cg)
		})
	}
	cfg := e.config()
	cfg.FuseCgroup = strings.Join(cgs, ", ") + ", " + e.path("not-a-cgroup")
	ns, err := NewNodeServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const id = "p/c"
	staging := e.path("staging", "c")
	ntStage(t, ns, id, staging, ntRW, nil)
	d := ntDaemon(t, ns, id)
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", d.pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hiers {
		if !strings.Contains(string(b), ":"+h+":/"+name+"\n") {
			t.Fatalf("daemon %d is not in %s/%s:\n%s", d.pid, h, name, b)
		}
	}
	ntUnstage(t, ns, id, staging)
	ntNoMountsLeft(t, e)
}
