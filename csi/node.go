package csi

// The node service of the CSI driver: a staged volume is one peregrine-fuse daemon mounting the
// container on the staging path; publishing binds the staging path on a pod's target path.
// node_mounts.go holds the daemons' life cycle, the state files and the re-adoption after a
// restart of the plugin.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// TopologyNodeKey is the topology segment naming the node in NodeGetInfo.
const TopologyNodeKey = "topology.csi.peregrine.dev/node"

// ephemeralContextKey marks a CSI inline ephemeral volume in NodePublishVolume's volume context.
const ephemeralContextKey = "csi.storage.k8s.io/ephemeral"

// NodeConfig configures the node service.
type NodeConfig struct {
	// NodeID is this node's ID (the Kubernetes node name).
	NodeID string
	// MgmtAddr is the management service's address (host:port) given to peregrine-fuse; empty:
	// the daemon's default (PEREGRINE_MGMT, else 127.0.0.1 on the default port).
	MgmtAddr string
	// FuseBin is the peregrine-fuse binary; empty: found on PATH.
	FuseBin string
	// StateDir keeps the per-volume state files and daemon logs; it must survive restarts of
	// the plugin (a hostPath) for the daemons to be re-adopted.
	StateDir string
	// Topology segments added to NodeGetInfo's accessible topology.
	Topology map[string]string
	// MaxVolumes is NodeGetInfo's max_volumes_per_node (0: no limit).
	MaxVolumes int64
	// Ephemeral provisions CSI inline ephemeral volumes; nil: they are refused.
	Ephemeral EphemeralProvisioner
	// Mgmt is the management service the node asks, before every publish, for the namespaces
	// the volume's pool and container allow (PoolQuery and ContQuery, which the node's client
	// certificate may make; access.go). The driver always sets it; nil skips the check (tests
	// of the node service alone, without a store).
	Mgmt mgmtpb.MgmtClient
	// FuseCgroup: comma-separated cgroup directories (one per hierarchy with cgroup v1) the
	// daemons are moved to, so that the container runtime stopping the plugin's cgroup leaves
	// them running. Empty: they stay in the plugin's cgroup.
	FuseCgroup string
	// TLSDir is the node plugin's certificate; FuseTLSDir (default TLSDir) the daemons', of role
	// client, of which they get a copy kept under StateDir/tls (syncTLS). Insecure starts them
	// with --insecure. Neither: the daemons' own default (tests of the node service alone).
	TLSDir, FuseTLSDir string
	Insecure           bool
	// FuseIoUring is how the daemons of volumes that do not choose (ioUring) take the kernel's
	// requests; empty: auto (fuse_io_uring.go).
	FuseIoUring IoUringMode
}

// NodeServer implements the CSI node service. It embeds csi.UnsafeNodeServer (a nil
// interface, no behaviour) only to satisfy the generated interface's unexported method: every
// RPC is implemented here, and a method added to the spec fails the build instead of
// answering Unimplemented.
type NodeServer struct {
	csipb.UnsafeNodeServer
	cfg NodeConfig

	lock *os.File // flock on StateDir/lock: one node service per state directory

	// fuseTLS: the FUSE daemon binary has the control plane's TLS flags (checkTLS).
	fuseTLS bool

	mu   sync.RWMutex
	vols map[string]*volume // by CSI volume ID
	busy map[string]bool    // volume IDs with an operation in flight
}

var _ csipb.NodeServer = (*NodeServer)(nil)

// NewNodeServer checks the configuration and re-adopts (or remounts) the volumes recorded in
// StateDir; see node_mounts.go for the policy.
func NewNodeServer(cfg NodeConfig) (*NodeServer, error) {
	if cfg.NodeID == "" {
		return nil, errors.New("csi node: no node ID")
	}
	if cfg.StateDir == "" {
		return nil, errors.New("csi node: no state directory")
	}
	if cfg.MaxVolumes < 0 {
		return nil, fmt.Errorf("csi node: max volumes %d < 0", cfg.MaxVolumes)
	}
	if cfg.FuseIoUring == "" {
		cfg.FuseIoUring = IoUringAuto
	} else if m, good := parseIoUring(string(cfg.FuseIoUring)); good {
		cfg.FuseIoUring = m // "AUTO" is auto: the daemon takes only the lower case
	} else {
		return nil, fmt.Errorf("csi node: FUSE over io_uring %q: want auto, on or off", cfg.FuseIoUring)
	}
	if cfg.FuseBin == "" {
		p, err := exec.LookPath("peregrine-fuse")
		if err != nil {
			return nil, fmt.Errorf("csi node: %w", err)
		}
		cfg.FuseBin = p
	} else if _, err := os.Stat(cfg.FuseBin); err != nil {
		return nil, fmt.Errorf("csi node: FUSE daemon binary: %w", err)
	}
	dir, err := filepath.Abs(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	cfg.StateDir = dir
	for _, sub := range []string{"volumes", "logs", "ephemeral"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("csi node: state directory: %w", err)
		}
	}
	// Two plugins on one state directory (an old pod not quite gone) would fight over the
	// daemons: the second one fails until the first has exited.
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("csi node: state directory: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("csi node: state directory %s is in use by another node plugin: %w", dir, err)
	}
	ns := &NodeServer{cfg: cfg, lock: lock, vols: map[string]*volume{}, busy: map[string]bool{}}
	if err := ns.checkTLS(); err != nil {
		_ = lock.Close()
		return nil, err
	}
	for _, st := range ns.loadStates() {
		ns.readopt(context.Background(), st)
	}
	return ns, nil
}

// Close releases the state directory for another NodeServer. The daemons and mounts stay, to
// be re-adopted by the next one.
func (ns *NodeServer) Close() error {
	return ns.lock.Close()
}

// Probe reports whether the node service can work (for liveness probes).
func (ns *NodeServer) Probe(ctx context.Context) error {
	if _, err := os.Stat(ns.cfg.FuseBin); err != nil {
		return fmt.Errorf("FUSE daemon binary: %w", err)
	}
	if _, err := os.Stat(filepath.Join(ns.cfg.StateDir, "volumes")); err != nil {
		return fmt.Errorf("state directory: %w", err)
	}
	return nil
}

// lockVolume serializes the operations on one volume; a second one meanwhile gets Aborted (the
// CO retries), as the CSI spec recommends.
func (ns *NodeServer) lockVolume(id string) (func(), error) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if ns.busy[id] {
		return nil, status.Errorf(codes.Aborted, "an operation on volume %s is in progress", id)
	}
	ns.busy[id] = true
	return func() {
		ns.mu.Lock()
		delete(ns.busy, id)
		ns.mu.Unlock()
	}, nil
}

func (ns *NodeServer) getVolume(id string) *volume {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	return ns.vols[id]
}

func (ns *NodeServer) putVolume(v *volume) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if v.st.Targets == nil {
		v.st.Targets = map[string]pubTarget{}
	}
	ns.vols[v.st.VolumeID] = v
}

// update replaces a volume's state and daemon (by the holder of its lock).
func (ns *NodeServer) update(v *volume, st volState, d *daemon) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	v.st, v.d = st, d
}

func (ns *NodeServer) dropVolume(id string) {
	ns.mu.Lock()
	defer ns.mu.Unlock()
	delete(ns.vols, id)
}

// snapshot copies a volume's state for readers without the volume's lock.
func (ns *NodeServer) snapshot(id string) (*volume, bool) {
	ns.mu.RLock()
	defer ns.mu.RUnlock()
	v, ok := ns.vols[id]
	if !ok {
		return nil, false
	}
	return &volume{st: v.clone(), d: v.d}, true
}

// checkCapability accepts the mount access type with a known access mode.
func checkCapability(c *csipb.VolumeCapability) error {
	if c == nil {
		return status.Error(codes.InvalidArgument, "volume capability missing")
	}
	if c.GetBlock() != nil {
		return status.Error(codes.InvalidArgument, "access type block is not supported: a Peregrine volume is a POSIX file system (access type mount)")
	}
	m := c.GetMount()
	if m == nil {
		return status.Error(codes.InvalidArgument, "volume capability has no access type (want mount)")
	}
	switch m.GetFsType() {
	case "", "fuse", "peregrine", fuseFsType:
	default:
		return status.Errorf(codes.InvalidArgument, "fs_type %q is not supported: peregrine-fuse mounts the volume (leave it empty or say %s)", m.GetFsType(), fuseFsType)
	}
	if c.GetAccessMode() == nil {
		return status.Error(codes.InvalidArgument, "volume capability has no access mode")
	}
	if m := c.GetAccessMode().GetMode(); m == csipb.VolumeCapability_AccessMode_UNKNOWN || csipb.VolumeCapability_AccessMode_Mode_name[int32(m)] == "" {
		return status.Errorf(codes.InvalidArgument, "access mode %v is not supported", m)
	}
	return nil
}

func readOnlyMode(c *csipb.VolumeCapability) bool {
	m := c.GetAccessMode().GetMode()
	return m == csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY || m == csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY
}

// durationRe is what peregrine-fuse takes as a duration: seconds, or a number with ms, s, m, h.
var durationRe = regexp.MustCompile(`^([0-9]+(\.[0-9]*)?|\.[0-9]+)(ms|s|m|h)?$`)

func checkDuration(v string) (string, bool) {
	m := durationRe.FindStringSubmatch(v)
	if m == nil {
		return "", false
	}
	f, err := strconv.ParseFloat(m[1], 64)
	return v, err == nil && f < 1e9
}

const (
	durationHelp = "a duration: seconds (1, 0.5) or a number with ms, s, m or h (500ms, 2s, 1m)"
	flagsHelp    = "ro, rw, threads=N, attr-timeout=DURATION, dentry-timeout=DURATION, data-cache=on|off|DURATION, io-uring=auto|on|off"
)

// set applies one option, from the volume context (src "volume context", the keys of
// mountParams) or a mount flag (the same keys in any case, with - or _, plus ro and rw without a
// value). known is false for a key that is no option.
func (o *mountOpts) set(src, key, val string, hasValue bool) (known bool, err error) {
	val = strings.TrimSpace(val)
	bad := func(want string) error {
		return status.Errorf(codes.InvalidArgument, "%s %s=%q is invalid: want %s", src, key, val, want)
	}
	switch norm := strings.NewReplacer("-", "", "_", "").Replace(strings.ToLower(key)); {
	case (norm == "ro" || norm == "rw") && !hasValue:
		o.ReadOnly = norm == "ro"
	case norm == "readonly" && !hasValue:
		o.ReadOnly = true
	case norm == "readonly":
		b, perr := strconv.ParseBool(val)
		if perr != nil {
			return true, bad("true or false")
		}
		o.ReadOnly = b
	case norm == "threads" && hasValue:
		n, perr := strconv.Atoi(val)
		if perr != nil || n < 1 || n > 256 {
			return true, bad("an integer from 1 to 256")
		}
		o.Threads = n
	case (norm == "attrtimeout" || norm == "dentrytimeout") && hasValue:
		d, good := checkDuration(val)
		if !good {
			return true, bad(durationHelp)
		}
		if norm == "attrtimeout" {
			o.AttrTimeout = d
		} else {
			o.DentryTimeout = d
		}
	case norm == "iouring" && hasValue:
		m, good := parseIoUring(val)
		if !good {
			return true, bad("auto, on or off")
		}
		o.IoUring = m
	case norm == "datacache" && hasValue:
		switch l := strings.ToLower(val); l {
		case "on", "true", "yes":
			o.DataCache = "on"
		case "off", "false", "no":
			o.DataCache = "off"
		default:
			d, good := checkDuration(l)
			if !good {
				return true, bad("on, off or " + durationHelp)
			}
			o.DataCache = d
		}
	default:
		return false, nil
	}
	return true, nil
}

// parseMountOpts reads the daemon's options from the volume context (other keys are the
// controller's and the CO's, and ignored) and the capability's mount flags, which take
// precedence. A reader-only access mode mounts read-only whatever the rest says.
func parseMountOpts(id VolumeID, c *csipb.VolumeCapability, vctx map[string]string) (mountOpts, error) {
	o := mountOpts{Pool: id.Pool, Cont: id.Cont}
	for _, k := range mountParams {
		if v, ok := vctx[k]; ok {
			if _, err := o.set("volume context", k, v, true); err != nil {
				return o, err
			}
		}
	}
	for _, flag := range c.GetMount().GetMountFlags() {
		for _, kv := range strings.Split(flag, ",") {
			if kv = strings.TrimSpace(kv); kv == "" {
				continue
			}
			k, v, hasValue := strings.Cut(kv, "=")
			if known, err := o.set("mount flag", k, v, hasValue); err != nil {
				return o, err
			} else if !known {
				return o, status.Errorf(codes.InvalidArgument, "mount flag %q is not supported: allowed are %s", kv, flagsHelp)
			}
		}
	}
	if readOnlyMode(c) {
		o.ReadOnly = true
	}
	return o, nil
}

// statusOf keeps a gRPC status' code, else uses code.
func statusOf(err error, code codes.Code, what string) error {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return status.Errorf(s.Code(), "%s: %s", what, s.Message())
	}
	return status.Errorf(code, "%s: %v", what, err)
}

// NodeStageVolume starts the volume's peregrine-fuse daemon on the staging path.
func (ns *NodeServer) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	id, err := ParseVolumeID(req.GetVolumeId())
	if err != nil {
		return nil, status.Error(codes.NotFound, err.Error())
	}
	opts, err := parseMountOpts(id, req.GetVolumeCapability(), req.GetVolumeContext())
	if err != nil {
		return nil, err
	}
	unlock, err := ns.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	staging := canonical(req.GetStagingTargetPath())
	if v := ns.getVolume(req.GetVolumeId()); v != nil {
		switch {
		case v.st.Ephemeral != nil:
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is an inline ephemeral volume", req.GetVolumeId())
		case v.st.StagingPath != staging:
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is already staged at %s", req.GetVolumeId(), v.st.StagingPath)
		case v.st.Opts != opts:
			return nil, status.Errorf(codes.AlreadyExists, "volume %s is staged at %s with other options (%+v, now asked %+v); unstage it first",
				req.GetVolumeId(), staging, v.st.Opts, opts)
		}
		if err := ns.heal(ctx, v); err != nil {
			return nil, err
		}
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	st := volState{VolumeID: req.GetVolumeId(), StagingPath: staging, Opts: opts, Targets: map[string]pubTarget{}}
	d, err := ns.startDaemon(ctx, &st)
	if err != nil {
		_ = os.Remove(ns.logPath(st.VolumeID)) // its tail is in the error
		return nil, err
	}
	if err := ns.saveState(st); err != nil {
		_ = stopDaemon(st, d)
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	ns.putVolume(&volume{st: st, d: d})
	slog.Info("csi node: staged", "volume", st.VolumeID, "staging", staging, "pid", d.pid)
	return &csipb.NodeStageVolumeResponse{}, nil
}

// NodeUnstageVolume stops the daemon (it unmounts the staging path) and forgets the volume.
func (ns *NodeServer) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path missing")
	}
	unlock, err := ns.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	staging := canonical(req.GetStagingTargetPath())
	v := ns.getVolume(req.GetVolumeId())
	if v == nil || v.st.Ephemeral != nil || v.st.StagingPath != staging {
		// Not staged here as far as we know: whatever is mounted on the path goes (a daemon
		// nobody recorded exits once its mount is gone).
		if err := unmountAll(staging); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		return &csipb.NodeUnstageVolumeResponse{}, nil
	}
	if n := len(v.st.Targets); n > 0 {
		slog.Warn("csi node: unstaging a volume still published", "volume", v.st.VolumeID, "targets", n)
	}
	if err := stopDaemon(v.st, v.d); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := ns.removeState(v.st.VolumeID); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	ns.dropVolume(v.st.VolumeID)
	slog.Info("csi node: unstaged", "volume", v.st.VolumeID, "staging", staging)
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// NodePublishVolume binds the staging path (or, for an inline ephemeral volume, a private
// mount made here) on the target path.
func (ns *NodeServer) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	}
	if err := checkCapability(req.GetVolumeCapability()); err != nil {
		return nil, err
	}
	eph := req.GetVolumeContext()[ephemeralContextKey] == "true"
	if !eph && req.GetStagingTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "staging target path missing (this plugin stages volumes)")
	}
	if eph && ns.cfg.Ephemeral == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s: inline ephemeral volumes are not enabled on this node", req.GetVolumeId())
	}
	unlock, err := ns.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	target := canonical(req.GetTargetPath())
	var v *volume
	created := false
	if eph {
		if v, created, err = ns.ensureEphemeral(ctx, req); err != nil {
			return nil, err
		}
	} else {
		// Who may use the volume is asked of the store at every publish: a change of the
		// namespaces a pool or container allows holds for the next pod. An inline volume's pool
		// was checked when its container was made (CreateEphemeral), for this pod.
		if ns.cfg.Mgmt != nil {
			id, err := ParseVolumeID(req.GetVolumeId())
			if err != nil {
				return nil, status.Error(codes.NotFound, err.Error())
			}
			if err := checkPodAccess(ctx, ns.cfg.Mgmt, id, podRequester(req.GetVolumeContext())); err != nil {
				return nil, err
			}
		}
		v = ns.getVolume(req.GetVolumeId())
		if v == nil || v.st.Ephemeral != nil {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged on this node", req.GetVolumeId())
		}
		if staging := canonical(req.GetStagingTargetPath()); v.st.StagingPath != staging {
			return nil, status.Errorf(codes.FailedPrecondition, "volume %s is staged at %s, not at %s", req.GetVolumeId(), v.st.StagingPath, staging)
		}
		if err := ns.heal(ctx, v); err != nil {
			return nil, err
		}
	}
	ro := req.GetReadonly() || readOnlyMode(req.GetVolumeCapability()) || v.st.Opts.ReadOnly
	if err := ns.publishTarget(v, target, ro); err != nil {
		if created {
			if terr := ns.teardownEphemeral(ctx, v); terr != nil {
				slog.Error("csi node: cleaning up a failed inline volume", "volume", v.st.VolumeID, "err", terr)
			}
		}
		return nil, err
	}
	slog.Info("csi node: published", "volume", v.st.VolumeID, "target", target, "readOnly", ro)
	return &csipb.NodePublishVolumeResponse{}, nil
}

// publishTarget binds v's staging path on target (idempotent).
func (ns *NodeServer) publishTarget(v *volume, target string, ro bool) error {
	h, top, _ := probeMount(target)
	switch h {
	case mountLive, mountHung:
		staging, _ := mountsAt(v.st.StagingPath)
		if len(staging) > 0 && top.Major == staging[len(staging)-1].Major && top.Minor == staging[len(staging)-1].Minor {
			isRO := false
			for _, o := range strings.Split(top.Options, ",") {
				isRO = isRO || o == "ro"
			}
			if isRO != ro {
				return status.Errorf(codes.AlreadyExists, "volume %s is published on %s with read-only=%v, now asked read-only=%v", v.st.VolumeID, target, isRO, ro)
			}
			if t, ok := v.st.Targets[target]; !ok || t.ReadOnly != ro {
				return ns.recordTarget(v, target, ro)
			}
			return nil
		}
		return status.Errorf(codes.AlreadyExists, "target path %s holds another mount (%s %s)", target, top.FSType, top.Source)
	case mountForeign:
		return status.Errorf(codes.AlreadyExists, "target path %s holds another file system (%s %s)", target, top.FSType, top.Source)
	case mountDead:
		if err := detach(target); err != nil {
			return status.Errorf(codes.Internal, "%v", err)
		}
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return status.Errorf(codes.Internal, "target path: %v", err)
	}
	if err := bindMount(v.st.StagingPath, target, ro); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	if err := ns.recordTarget(v, target, ro); err != nil {
		_ = detach(target)
		return err
	}
	return nil
}

func (ns *NodeServer) recordTarget(v *volume, target string, ro bool) error {
	st := v.clone()
	st.Targets[target] = pubTarget{ReadOnly: ro}
	if err := ns.saveState(st); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	ns.update(v, st, v.d)
	return nil
}

// ensureEphemeral mounts an inline ephemeral volume on its private staging directory, creating
// its container; created tells whether this call did.
func (ns *NodeServer) ensureEphemeral(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*volume, bool, error) {
	id := req.GetVolumeId()
	if v := ns.getVolume(id); v != nil {
		if v.st.Ephemeral == nil {
			return nil, false, status.Errorf(codes.FailedPrecondition, "volume %s is staged, not an inline ephemeral volume", id)
		}
		return v, false, ns.heal(ctx, v)
	}
	// Options first: a bad attribute creates no container.
	if _, err := parseMountOpts(VolumeID{}, req.GetVolumeCapability(), req.GetVolumeContext()); err != nil {
		return nil, false, err
	}
	vid, err := ns.cfg.Ephemeral.CreateEphemeral(ctx, id, req.GetVolumeContext())
	if err != nil {
		return nil, false, statusOf(err, codes.Internal, "creating the container of inline volume "+id)
	}
	opts, _ := parseMountOpts(vid, req.GetVolumeCapability(), req.GetVolumeContext())
	dir := filepath.Join(ns.ephemeralDir(id), "mnt")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, false, status.Errorf(codes.Internal, "%v", err)
	}
	st := volState{VolumeID: id, StagingPath: canonical(dir), Opts: opts, Targets: map[string]pubTarget{}, Ephemeral: &vid}
	// Recorded before the daemon starts, so that a crash leaves a trace to clean up.
	err = ns.saveState(st)
	var d *daemon
	if err == nil {
		d, err = ns.startDaemon(ctx, &st)
	}
	if err == nil {
		err = ns.saveState(st)
	}
	if err != nil {
		if d != nil {
			_ = stopDaemon(st, d)
		}
		_ = ns.removeState(id)
		_ = os.RemoveAll(ns.ephemeralDir(id)) // nothing is mounted there any more
		if derr := ns.cfg.Ephemeral.DeleteEphemeral(ctx, vid); derr != nil {
			slog.Error("csi node: deleting the container of a failed inline volume", "volume", id, "container", vid.String(), "err", derr)
		}
		return nil, false, statusOf(err, codes.Internal, "inline volume "+id)
	}
	v := &volume{st: st, d: d}
	ns.putVolume(v)
	return v, true, nil
}

// teardownEphemeral stops an inline volume's daemon and deletes its container.
func (ns *NodeServer) teardownEphemeral(ctx context.Context, v *volume) error {
	if err := stopDaemon(v.st, v.d); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	st := v.clone()
	st.Pid, st.PidStart = 0, 0
	ns.update(v, st, nil)
	_ = ns.saveState(st)
	if _, err := os.Stat(st.StagingPath); err == nil {
		_ = os.Remove(st.StagingPath)
		_ = os.Remove(filepath.Dir(st.StagingPath))
	}
	if ns.cfg.Ephemeral == nil {
		return status.Errorf(codes.FailedPrecondition, "inline volume %s: no ephemeral provisioner to delete container %s", st.VolumeID, st.Ephemeral)
	}
	if err := ns.cfg.Ephemeral.DeleteEphemeral(ctx, *st.Ephemeral); err != nil {
		return statusOf(err, codes.Internal, "deleting container "+st.Ephemeral.String()+" of inline volume "+st.VolumeID)
	}
	if err := ns.removeState(st.VolumeID); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	ns.dropVolume(st.VolumeID)
	return nil
}

// NodeUnpublishVolume unmounts the target path (lazily when dead or busy) and removes it; for
// an inline ephemeral volume it also stops the daemon and deletes the container.
func (ns *NodeServer) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetTargetPath() == "" {
		return nil, status.Error(codes.InvalidArgument, "target path missing")
	}
	unlock, err := ns.lockVolume(req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	defer unlock()
	target := canonical(req.GetTargetPath())
	if err := unmountAll(target); err != nil {
		return nil, status.Errorf(codes.Internal, "%v", err)
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing the target path: %v", err)
	}
	v := ns.getVolume(req.GetVolumeId())
	if v == nil {
		return &csipb.NodeUnpublishVolumeResponse{}, nil
	}
	if _, ok := v.st.Targets[target]; ok {
		st := v.clone()
		delete(st.Targets, target)
		if err := ns.saveState(st); err != nil {
			return nil, status.Errorf(codes.Internal, "%v", err)
		}
		ns.update(v, st, v.d)
	}
	if v.st.Ephemeral != nil && len(v.st.Targets) == 0 {
		if err := ns.teardownEphemeral(ctx, v); err != nil {
			return nil, err
		}
	}
	slog.Info("csi node: unpublished", "volume", req.GetVolumeId(), "target", target)
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

// volumeOfPath finds a volume and checks that path is its staging path or a publish target.
func (ns *NodeServer) volumeOfPath(id, path string) (*volume, string, error) {
	v, ok := ns.snapshot(id)
	if !ok {
		return nil, "", status.Errorf(codes.NotFound, "volume %s is not staged or published on this node", id)
	}
	p := canonical(path)
	if _, known := v.st.Targets[p]; !known && p != v.st.StagingPath {
		return nil, "", status.Errorf(codes.NotFound, "%s is not a path of volume %s on this node", path, id)
	}
	if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) {
		return nil, "", status.Errorf(codes.NotFound, "%s does not exist", path)
	}
	return v, p, nil
}

// NodeGetVolumeStats reports the space and inodes of the container as the mount shows them,
// and an abnormal condition when the daemon is gone or the mount does not answer.
func (ns *NodeServer) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	v, p, err := ns.volumeOfPath(req.GetVolumeId(), req.GetVolumePath())
	if err != nil {
		return nil, err
	}
	var abnormal []string
	if !v.d.alive() {
		abnormal = append(abnormal, fmt.Sprintf("peregrine-fuse (pid %d) is not running (log: %s)", v.st.Pid, ns.logPath(v.st.VolumeID)))
	}
	fs, err := statfsWithin(p, statfsTimeout)
	switch {
	case daemonGone(err):
		abnormal = append(abnormal, fmt.Sprintf("%s: %v (the FUSE daemon is gone)", p, errors.Unwrap(err)))
	case err != nil:
		abnormal = append(abnormal, err.Error())
	case fs.Type != fuseSuperMagic:
		abnormal = append(abnormal, fmt.Sprintf("%s is not mounted", p))
	}
	bytes := &csipb.VolumeUsage{Unit: csipb.VolumeUsage_BYTES}
	inodes := &csipb.VolumeUsage{Unit: csipb.VolumeUsage_INODES}
	cond := &csipb.VolumeCondition{Message: "mounted; peregrine-fuse (pid " + strconv.Itoa(v.st.Pid) + ") answers"}
	if len(abnormal) > 0 {
		cond = &csipb.VolumeCondition{Abnormal: true, Message: strings.Join(abnormal, "; ")}
	} else {
		bs := int64(fs.Frsize)
		if bs <= 0 {
			bs = fs.Bsize
		}
		bytes.Total = int64(fs.Blocks) * bs
		bytes.Available = int64(fs.Bavail) * bs
		bytes.Used = int64(fs.Blocks-fs.Bfree) * bs
		inodes.Total = int64(fs.Files)
		inodes.Available = int64(fs.Ffree)
		inodes.Used = int64(fs.Files - fs.Ffree)
	}
	// Usage is reported (zeros) with an abnormal condition too: kubelet drops a response
	// without usage, condition included.
	return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{bytes, inodes}, VolumeCondition: cond}, nil
}

// NodeExpandVolume has nothing to do: a container's quota lives in the store and the
// controller's expansion is online (node_expansion_required false), so EXPAND_VOLUME is not
// declared; a CO calling anyway gets the requested size back.
func (ns *NodeServer) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume ID missing")
	}
	if req.GetVolumePath() == "" {
		return nil, status.Error(codes.InvalidArgument, "volume path missing")
	}
	if c := req.GetVolumeCapability(); c != nil {
		if err := checkCapability(c); err != nil {
			return nil, err
		}
	}
	if _, _, err := ns.volumeOfPath(req.GetVolumeId(), req.GetVolumePath()); err != nil {
		return nil, err
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: req.GetCapacityRange().GetRequiredBytes()}, nil
}

// NodeGetCapabilities: staging, volume stats with condition, single-node multi-writer modes.
func (ns *NodeServer) NodeGetCapabilities(ctx context.Context, req *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, t := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_VOLUME_CONDITION,
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: t}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

// NodeGetInfo: the node ID, the volume limit and the topology (the node segment plus
// cfg.Topology).
func (ns *NodeServer) NodeGetInfo(ctx context.Context, req *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	seg := map[string]string{}
	for k, v := range ns.cfg.Topology {
		seg[k] = v
	}
	seg[TopologyNodeKey] = ns.cfg.NodeID
	return &csipb.NodeGetInfoResponse{
		NodeId:             ns.cfg.NodeID,
		MaxVolumesPerNode:  ns.cfg.MaxVolumes,
		AccessibleTopology: &csipb.Topology{Segments: seg},
	}, nil
}
