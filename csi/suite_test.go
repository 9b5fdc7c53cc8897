package csi

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/peregrine-storage/peregrine/internal/testengine"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// driverUnderTest is a real driver (controller and node in one process) on a real engine
// system with one pool, serving a unix socket.
type driverUnderTest struct {
	sys      *testengine.System
	driver   *Driver
	endpoint string
	dir      string
	cancel   context.CancelFunc
	done     chan error
}

// startDriver starts `engines` engines, creates pool `pool` of poolSize bytes and a driver
// serving on a socket under a fresh directory; everything stops at the test's end.
func startDriver(t *testing.T, engines int, pool string, poolSize uint64) *driverUnderTest {
	t.Helper()
	if err := testengine.CheckFuse(); err != nil {
		t.Skipf("real FUSE mounts needed: %v", err)
	}
	fuse, err := testengine.Bin("peregrine-fuse")
	if err != nil {
		t.Fatal(err)
	}
	// Short paths: unix socket paths are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "csi-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sys, err := testengine.Start("csi", filepath.Join(dir, "engines"), engines, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sys.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := sys.Mgmt().PoolCreate(ctx, &mgmtpb.PoolCreateReq{Label: pool, TotalSize: poolSize}); err != nil {
		t.Fatalf("pool create: %v", err)
	}
	d, err := NewDriver(Config{
		Mode: ModeAll, Version: "test", Endpoint: "unix://" + filepath.Join(dir, "csi.sock"), MgmtAddr: sys.MgmtAddr,
		TLSDir: sys.AdminTLSDir, Insecure: sys.AdminTLSDir == "",
		Node: NodeConfig{NodeID: "node-a", StateDir: filepath.Join(dir, "state"), FuseBin: fuse},
	})
	if err != nil {
		t.Fatal(err)
	}
	dut := &driverUnderTest{sys: sys, driver: d, endpoint: "unix://" + filepath.Join(dir, "csi.sock"), dir: dir, done: make(chan error, 1)}
	rctx, rcancel := context.WithCancel(context.Background())
	dut.cancel = rcancel
	go func() { dut.done <- d.Run(rctx) }()
	t.Cleanup(func() {
		rcancel()
		<-dut.done
		_ = d.Close()
		unmountUnder(dir)
	})
	waitSocket(t, filepath.Join(dir, "csi.sock"))
	return dut
}

func waitSocket(t *testing.T, path string) {
	t.Helper()
	for i := 0; i < 100; i++ {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s did not appear", path)
}

// unmountUnder lazily unmounts every mount below dir (deepest first), so that a failed test
// leaves no FUSE mount behind for the next.
func unmountUnder(dir string) {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}
