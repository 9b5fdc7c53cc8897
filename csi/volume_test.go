package csi

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/peregrine-storage/peregrine/internal/testengine"
)

// csiClients talks to the driver under test as the CO and its sidecars do: over its socket.
type csiClients struct {
	ctrl csipb.ControllerClient
	node csipb.NodeClient
}

func dial(t *testing.T, dut *driverUnderTest) csiClients {
	t.Helper()
	conn, err := grpc.NewClient(dut.endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return csiClients{ctrl: csipb.NewControllerClient(conn), node: csipb.NewNodeClient(conn)}
}

var rwx = &csipb.VolumeCapability{
	AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
	AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER},
}

// mountVolume stages and publishes a volume as the kubelet would, at dir/target.
func mountVolume(t *testing.T, c csiClients, vol *csipb.Volume, dir string) string {
	t.Helper()
	ctx := context.Background()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	if err := os.MkdirAll(staging, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := c.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
		VolumeCapability: rwx, VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatalf("stage: %v", err)
	}
	if _, err := c.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: rwx, VolumeContext: vol.VolumeContext}); err != nil {
		t.Fatalf("publish: %v", err)
	}
	t.Cleanup(func() {
		_, _ = c.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: vol.VolumeId, TargetPath: target})
		_, _ = c.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: vol.VolumeId, StagingTargetPath: staging})
	})
	return target
}

func createVolume(t *testing.T, c csiClients, name string, size int64, params map[string]string, src *csipb.VolumeContentSource) *csipb.Volume {
	t.Helper()
	resp, err := c.ctrl.CreateVolume(context.Background(), &csipb.CreateVolumeRequest{Name: name, Parameters: params,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: size}, VolumeCapabilities: []*csipb.VolumeCapability{rwx},
		VolumeContentSource: src})
	if err != nil {
		t.Fatalf("create volume %s: %v", name, err)
	}
	return resp.Volume
}

// dd writes count MiB to path (appending after `seek` MiB) and returns dd's error output, ""
// when it succeeded; env adds to the environment (LD_PRELOAD for the interception library).
func dd(t *testing.T, path string, seek, count int, env ...string) string {
	t.Helper()
	cmd := exec.Command("dd", "if=/dev/urandom", "of="+path, "bs=1M", "count="+strconv.Itoa(count), "seek="+strconv.Itoa(seek), "conv=notrunc,fsync")
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return stderr.String() + err.Error()
	}
	return ""
}

func statfs(t *testing.T, p string) (size, avail uint64) {
	t.Helper()
	var s syscall.Statfs_t
	if err := syscall.Statfs(p, &s); err != nil {
		t.Fatal(err)
	}
	return s.Blocks * uint64(s.Bsize), s.Bavail * uint64(s.Bsize)
}

// TestQuotaThroughMount: a PVC's size is a quota the engines enforce, seen by writes through
// the FUSE mount and through the interception library, shown by df, and raised online by
// ControllerExpandVolume.
func TestQuotaThroughMount(t *testing.T) {
	dut := startDriver(t, 1, "q", 512<<20)
	c := dial(t, dut)
	il, err := testengine.Bin("libperegrine_il.so")
	if err != nil {
		t.Fatal(err)
	}
	vol := createVolume(t, c, "pvc-quota", 16<<20, map[string]string{ParamPool: "q"}, nil)
	if vol.CapacityBytes != 16<<20 {
		t.Fatalf("capacity %d, want 16 MiB", vol.CapacityBytes)
	}
	mnt := mountVolume(t, c, vol, filepath.Join(dut.dir, "v"))
	size, _ := statfs(t, mnt)
	if size != 16<<20 {
		t.Fatalf("df size %d, want the 16 MiB asked", size)
	}

	// Through the kernel (FUSE): 12 MiB fit, 12 more do not.
	if out := dd(t, filepath.Join(mnt, "a"), 0, 12); out != "" {
		t.Fatalf("12 MiB under a 16 MiB quota: %s", out)
	}
	out := dd(t, filepath.Join(mnt, "b"), 0, 12)
	if !strings.Contains(out, "quota exceeded") && !strings.Contains(out, "Disk quota") {
		t.Fatalf("12 more MiB past the quota through the mount: want EDQUOT, got %q", out)
	}
	time.Sleep(2 * time.Second) // the service measures the container again
	// Through the interception library (straight to the engines).
	out = dd(t, filepath.Join(mnt, "c"), 0, 8, "LD_PRELOAD="+il, "PEREGRINE_IL_REPORT=1")
	if !strings.Contains(out, "quota exceeded") && !strings.Contains(out, "Disk quota") {
		t.Fatalf("8 MiB past the quota through the interception library: want EDQUOT, got %q", out)
	}
	if _, avail := statfs(t, mnt); avail > 2<<20 {
		t.Fatalf("df shows %d bytes available on a full volume", avail)
	}

	// Expanded online: the writes go through, df shows the new size.
	resp, err := c.ctrl.ControllerExpandVolume(context.Background(), &csipb.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 64 << 20}})
	if err != nil || resp.CapacityBytes != 64<<20 || resp.NodeExpansionRequired {
		t.Fatalf("expand: %v %v", resp, err)
	}
	if size, _ := statfs(t, mnt); size != 64<<20 {
		t.Fatalf("df size %d after expansion, want 64 MiB", size)
	}
	if out := dd(t, filepath.Join(mnt, "d"), 0, 16); out != "" {
		t.Fatalf("16 MiB after expansion through the mount: %s", out)
	}
	if out := dd(t, filepath.Join(mnt, "e"), 0, 16, "LD_PRELOAD="+il); out != "" {
		t.Fatalf("16 MiB after expansion through the interception library: %s", out)
	}
	// Expansion never shrinks.
	resp, err = c.ctrl.ControllerExpandVolume(context.Background(), &csipb.ControllerExpandVolumeRequest{VolumeId: vol.VolumeId,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 8 << 20}})
	if err != nil || resp.CapacityBytes != 64<<20 {
		t.Fatalf("expand to less: %v %v", resp, err)
	}
}

// TestVolumeFromSnapshot: a snapshot of a volume and a volume made from it (and one cloned from
// the volume directly) hold the files as they were, whatever the source did after.
func TestVolumeFromSnapshot(t *testing.T) {
	dut := startDriver(t, 1, "s", 512<<20)
	c := dial(t, dut)
	ctx := context.Background()
	src := createVolume(t, c, "pvc-src", 32<<20, map[string]string{ParamPool: "s"}, nil)
	mnt := mountVolume(t, c, src, filepath.Join(dut.dir, "src"))
	want := bytes.Repeat([]byte("peregrine "), 300_000)
	if err := os.MkdirAll(filepath.Join(mnt, "dir/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "dir/sub/f"), want, 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("sub/f", filepath.Join(mnt, "dir/link")); err != nil {
		t.Fatal(err)
	}
	snap, err := c.ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "snap-1", SourceVolumeId: src.VolumeId})
	if err != nil {
		t.Fatal(err)
	}
	// The source changes after the snapshot.
	if err := os.WriteFile(filepath.Join(mnt, "dir/sub/f"), []byte("changed"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "later"), []byte("later"), 0o640); err != nil {
		t.Fatal(err)
	}

	restored := createVolume(t, c, "pvc-restored", 32<<20, map[string]string{ParamPool: "s"}, &csipb.VolumeContentSource{
		Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snap.Snapshot.SnapshotId}}})
	rm := mountVolume(t, c, restored, filepath.Join(dut.dir, "restored"))
	got, err := os.ReadFile(filepath.Join(rm, "dir/link"))
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("restored volume: %d bytes, %v; want the %d bytes of the snapshot", len(got), err, len(want))
	}
	if _, err := os.Stat(filepath.Join(rm, "later")); !os.IsNotExist(err) {
		t.Fatalf("a file made after the snapshot is in the restored volume: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(rm, "dir/sub/f")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("restored file mode: %v %v", fi, err)
	}
	// The restored volume is writable and apart from the source.
	if err := os.WriteFile(filepath.Join(rm, "dir/sub/f"), []byte("restored's own"), 0o640); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(filepath.Join(mnt, "dir/sub/f")); string(got) != "changed" {
		t.Fatalf("the source reads %q after a write to the restored volume", got)
	}

	// A volume cloned from the volume holds its present state; the snapshot taken for the copy
	// is gone afterwards.
	cloned := createVolume(t, c, "pvc-cloned", 32<<20, map[string]string{ParamPool: "s"}, &csipb.VolumeContentSource{
		Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: src.VolumeId}}})
	cm := mountVolume(t, c, cloned, filepath.Join(dut.dir, "cloned"))
	if got, _ := os.ReadFile(filepath.Join(cm, "later")); string(got) != "later" {
		t.Fatalf("cloned volume reads %q", got)
	}
	list, err := c.ctrl.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{SourceVolumeId: src.VolumeId})
	if err != nil || len(list.Entries) != 1 || list.Entries[0].Snapshot.SnapshotId != snap.Snapshot.SnapshotId {
		t.Fatalf("snapshots of the source: %v %v", list, err)
	}

	// A volume with snapshots is not deleted under them.
	_, err = c.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: src.VolumeId})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("delete a volume with a snapshot: %v", err)
	}
}

// TestParameterErrors: every bad StorageClass parameter is refused by name, with what it allows.
func TestParameterErrors(t *testing.T) {
	dut := startDriver(t, 1, "e", 256<<20)
	c := dial(t, dut)
	cases := []struct {
		params  map[string]string
		size    int64
		code    codes.Code
		mention []string
	}{
		{map[string]string{}, 0, codes.InvalidArgument, []string{"pool", "missing"}},
		{map[string]string{"pool": "nope"}, 0, codes.NotFound, []string{"nope", "pool"}},
		{map[string]string{"pool": "e", "oclass": "RAID5"}, 0, codes.InvalidArgument, []string{"oclass", "RAID5", "EC_2P1G1"}},
		{map[string]string{"pool": "e", "dirOclass": "x"}, 0, codes.InvalidArgument, []string{"dirOclass", "S1"}},
		{map[string]string{"pool": "e", "chunkSize": "3000"}, 0, codes.InvalidArgument, []string{"chunkSize", "power of two"}},
		{map[string]string{"pool": "e", "rf": "9"}, 0, codes.InvalidArgument, []string{"rf", "0, 1, 2, 3 or 4"}},
		{map[string]string{"pool": "e", "checksum": "md5"}, 0, codes.InvalidArgument, []string{"checksum", "crc32c or off"}},
		{map[string]string{"pool": "e", "sync": "sometimes"}, 0, codes.InvalidArgument, []string{"sync", "standard or always"}},
		{map[string]string{"pool": "e", "colour": "red"}, 0, codes.InvalidArgument, []string{"colour", "unknown", "oclass"}},
		// The store's own checks: a class wider than the pool, a redundancy the class lacks.
		{map[string]string{"pool": "e", "oclass": "RP_3G1"}, 0, codes.InvalidArgument, []string{"RP_3G1", "engines"}},
		{map[string]string{"pool": "e", "rf": "1"}, 0, codes.InvalidArgument, []string{"redundancy factor"}},
		// Bigger than the pool.
		{map[string]string{"pool": "e"}, 1 << 40, codes.ResourceExhausted, []string{"pool \"e\"", "free"}},
	}
	for i, tc := range cases {
		_, err := c.ctrl.CreateVolume(context.Background(), &csipb.CreateVolumeRequest{Name: "pvc-bad-" + strconv.Itoa(i),
			Parameters: tc.params, CapacityRange: &csipb.CapacityRange{RequiredBytes: tc.size},
			VolumeCapabilities: []*csipb.VolumeCapability{rwx}})
		st := status.Convert(err)
		if st.Code() != tc.code {
			t.Errorf("%v: code %v (%s), want %v", tc.params, st.Code(), st.Message(), tc.code)
			continue
		}
		for _, m := range tc.mention {
			if !strings.Contains(st.Message(), m) {
				t.Errorf("%v: message %q does not mention %q", tc.params, st.Message(), m)
			}
		}
	}
	// Nothing was left behind by the refusals.
	list, err := c.ctrl.ListVolumes(context.Background(), &csipb.ListVolumesRequest{})
	if err != nil || len(list.Entries) != 0 {
		t.Fatalf("volumes after refused creations: %v %v", list, err)
	}
}
