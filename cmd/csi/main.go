// Command peregrine-csi is Peregrine's CSI driver (csi.peregrine.dev): the controller service
// (one Deployment, beside the external-provisioner, -resizer and -snapshotter sidecars) or the
// node service (a DaemonSet that registers itself with the kubelet and serves its own liveness
// endpoint), or both in one process.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sync/errgroup"

	"github.com/peregrine-storage/peregrine/csi"
)

var version = "dev"

func main() {
	var (
		mode        = flag.String("mode", "node", "services to serve: controller, node or all")
		endpoint    = flag.String("endpoint", "unix:///csi/csi.sock", "CSI endpoint (unix socket)")
		mgmt        = flag.String("mgmt", os.Getenv("PEREGRINE_MGMT"), "management service address host:port (env PEREGRINE_MGMT)")
		defaultPool = flag.String("default-pool", "", "pool of StorageClasses that name none")
		nodeID      = flag.String("node-id", os.Getenv("NODE_NAME"), "node name (env NODE_NAME)")
		stateDir    = flag.String("state-dir", "/var/lib/peregrine/csi", "node: per-volume state and FUSE daemon logs (a host directory)")
		fuseBin     = flag.String("fuse-bin", "", "node: the peregrine-fuse binary (default: from PATH)")
		fuseCgroup  = flag.String("fuse-cgroup", "", "node: cgroup directories (comma-separated) the FUSE daemons move to, so that they outlive the plugin's container")
		maxVolumes  = flag.Int64("max-volumes", 0, "node: volumes per node (0: no limit)")
		topology    = flag.String("topology", "", "node: extra topology segments KEY=VALUE,... (e.g. the node's fault domain)")
		regSocket   = flag.String("registration-socket", "", "node: kubelet plugin-registration socket to serve, e.g. /registration/csi.peregrine.dev-reg.sock (empty: no registration)")
		kubeletPath = flag.String("kubelet-endpoint", "/var/lib/kubelet/plugins/csi.peregrine.dev/csi.sock", "node: the CSI socket's path as the kubelet sees it")
		healthAddr  = flag.String("health-addr", "", "serve GET /healthz (liveness: the driver's own prerequisites, not the store) on this address (e.g. :9808; empty: none)")
		tlsDir      = flag.String("tls-dir", os.Getenv("PEREGRINE_TLS_DIR"), "directory with ca.crt, tls.crt and tls.key (the operator's certificate Secret, mounted) for mutual TLS with the engines (env PEREGRINE_TLS_DIR)")
		fuseTLSDir  = flag.String("fuse-tls-dir", "", "node: the FUSE daemons' certificate directory (role client; default: --tls-dir)")
		fuseIoUring = flag.String("fuse-io-uring", "auto", "node: how the FUSE daemons of volumes that do not choose (ioUring) take the kernel's requests: auto (FUSE over io_uring where the kernel has it, its switch turned on), on (only; mounts fail without it) or off (/dev/fuse)")
		insecureCP  = flag.Bool("insecure-control-plane", os.Getenv("PEREGRINE_INSECURE") == "1", "talk to the engines without TLS (a ServerSet with spec.insecureControlPlane; logged as a warning; env PEREGRINE_INSECURE=1)")
	)
	flag.Parse()
	if err := run(*mode, *endpoint, *mgmt, *defaultPool, *nodeID, *stateDir, *fuseBin, *fuseCgroup, *maxVolumes,
		*topology, *regSocket, *kubeletPath, *healthAddr, *tlsDir, *fuseTLSDir, *fuseIoUring, *insecureCP); err != nil {
		slog.Error("peregrine-csi", "error", err)
		os.Exit(1)
	}
}

func run(modeName, endpoint, mgmt, defaultPool, nodeID, stateDir, fuseBin, fuseCgroup string, maxVolumes int64,
	topology, regSocket, kubeletPath, healthAddr, tlsDir, fuseTLSDir, fuseIoUring string, insecureCP bool) error {
	mode, err := csi.ParseMode(modeName)
	if err != nil {
		return err
	}
	topo := map[string]string{}
	for _, kv := range strings.Split(topology, ",") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("--topology %q: want KEY=VALUE,...", topology)
		}
		topo[k] = v
	}
	d, err := csi.NewDriver(csi.Config{
		Mode: mode, Version: version, Endpoint: endpoint, MgmtAddr: mgmt, DefaultPool: defaultPool, TLSDir: tlsDir, FuseTLSDir: fuseTLSDir, Insecure: insecureCP,
		Node: csi.NodeConfig{NodeID: nodeID, StateDir: stateDir, FuseBin: fuseBin, FuseCgroup: fuseCgroup,
			MaxVolumes: maxVolumes, Topology: topo, FuseIoUring: csi.IoUringMode(fuseIoUring)},
	})
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.Run(ctx) })
	if healthAddr != "" {
		g.Go(func() error { return csi.ServeHealth(ctx, healthAddr, d.Live) })
	}
	if regSocket != "" && mode != csi.ModeController {
		if !filepath.IsAbs(kubeletPath) {
			return fmt.Errorf("--kubelet-endpoint %q: want an absolute path", kubeletPath)
		}
		g.Go(func() error { return csi.ServeRegistration(ctx, regSocket, csi.DriverName, kubeletPath, nil) })
	}
	return g.Wait()
}
