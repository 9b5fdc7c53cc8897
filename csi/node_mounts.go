package csi

// The FUSE daemons behind staged volumes, their bind mounts, the per-volume state files in
// StateDir, and the re-adoption of daemons and mounts when the node plugin starts again.
//
// Layout of StateDir:
//
//	volumes/<key>.json    one volState per staged (or inline ephemeral) volume
//	logs/<key>.log        the stdout and stderr of its peregrine-fuse daemon
//	ephemeral/<key>/mnt   the private staging directory of an inline ephemeral volume
//
// where <key> is a hash of the CSI volume ID (IDs hold '/' and may be long).
//
// Re-adoption policy (NewNodeServer, for every state file):
//
//   - A volume is live when its daemon runs (the recorded pid exists, has not exited, and has the
//     recorded start time, so a reused pid is never taken for it) and its staging path is a
//     fuse.peregrine mount that answers statfs. A live volume is adopted as it is: the daemon is
//     not touched and open files in pods keep working. A statfs that does not answer within
//     statfsTimeout counts as live too: a busy daemon is never killed on a guess.
//   - Anything else is dead: the daemon is gone, or the mount answers ENOTCONN ("transport
//     endpoint is not connected"), or the staging mount is missing. A daemon still running with
//     a dead or missing mount is killed (SIGKILL, identity checked). The staging path and the
//     recorded publish targets are unmounted lazily (MNT_DETACH), the daemon is started again
//     with the recorded options, and the bind mounts of the recorded targets are made again.
//   - Of a live volume, publish targets whose bind mount is missing or dead are bound again.
//   - A recorded target whose directory no longer exists (the pod is gone) is forgotten, never
//     created again.
//   - A volume that cannot be brought back (engines unreachable, ...) keeps its state file: the
//     next NodeStageVolume or NodePublishVolume of it tries again, NodeUnstageVolume cleans it
//     up, NodeGetVolumeStats reports it abnormal. NewNodeServer itself does not fail for it.
//
// For the daemons to outlive the plugin, the plugin's pod must share the host's PID namespace
// (hostPID: true; the processes of a container's own PID namespace die with it), and with
// FuseCgroup the daemons are moved out of the plugin container's cgroup.

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	fuseSuperMagic = 0x65735546
	fuseFsType     = "fuse.peregrine"
	// mountTimeout bounds the wait for a new daemon's mount (further bounded by the request).
	mountTimeout = 60 * time.Second
	// stopTimeout is how long a daemon gets to unmount and exit after SIGTERM.
	stopTimeout = 10 * time.Second
	// statfsTimeout bounds a statfs of a FUSE mount whose daemon might hang.
	statfsTimeout = 5 * time.Second
)

// volState is the content of a state file.
type volState struct {
	VolumeID    string `json:"volumeID"`
	StagingPath string `json:"stagingPath"`
	// Pid and PidStart (the start time in /proc/PID/stat) identify the daemon.
	Pid      int       `json:"pid"`
	PidStart uint64    `json:"pidStart"`
	Args     []string  `json:"args"` // the daemon's arguments, as last run
	Opts     mountOpts `json:"opts"`
	// Targets are the publish targets (bind mounts of the staging path).
	Targets map[string]pubTarget `json:"targets,omitempty"`
	// Ephemeral is the container of an inline ephemeral volume (nil for staged volumes).
	Ephemeral *VolumeID `json:"ephemeral,omitempty"`
}

type pubTarget struct {
	ReadOnly bool `json:"readOnly"`
}

// mountOpts are the daemon's options of a volume.
type mountOpts struct {
	Pool          string `json:"pool"`
	Cont          string `json:"cont"`
	Threads       int    `json:"threads,omitempty"`
	AttrTimeout   string `json:"attrTimeout,omitempty"`
	DentryTimeout string `json:"dentryTimeout,omitempty"`
	DataCache     string `json:"dataCache,omitempty"`
	ReadOnly      bool   `json:"readOnly,omitempty"`
	// IoUring: the volume's choice; empty: the node's (NodeConfig.FuseIoUring).
	IoUring IoUringMode `json:"ioUring,omitempty"`
}

func (o mountOpts) args(mgmt, mountpoint string) []string {
	var a []string
	if mgmt != "" {
		a = append(a, "--mgmt", mgmt)
	}
	a = append(a, "--pool", o.Pool, "--cont", o.Cont, "--mountpoint", mountpoint)
	if o.Threads > 0 {
		a = append(a, "--threads", strconv.Itoa(o.Threads))
	}
	if o.AttrTimeout != "" {
		a = append(a, "--attr-timeout", o.AttrTimeout)
	}
	if o.DentryTimeout != "" {
		a = append(a, "--dentry-timeout", o.DentryTimeout)
	}
	if o.DataCache != "" {
		a = append(a, "--data-cache", o.DataCache)
	}
	if o.ReadOnly {
		a = append(a, "--read-only")
	}
	if o.IoUring != "" {
		a = append(a, "--io-uring", string(o.IoUring))
	}
	return append(a, "--foreground")
}

// volume is a state file's content plus the daemon handle.
type volume struct {
	st volState
	d  *daemon
}

func (v *volume) clone() volState {
	st := v.st
	st.Targets = make(map[string]pubTarget, len(v.st.Targets))
	for k, t := range v.st.Targets {
		st.Targets[k] = t
	}
	return st
}

// daemon is a peregrine-fuse process, started here (exited is closed when it ends) or adopted.
type daemon struct {
	pid    int
	start  uint64
	exited chan struct{}
}

func (d *daemon) alive() bool {
	if d == nil || d.pid <= 0 {
		return false
	}
	if d.exited != nil {
		// Our child: it is gone once reaped (wait4 returns when every thread has exited).
		select {
		case <-d.exited:
			return false
		default:
			return true
		}
	}
	return procAlive(d.pid, d.start)
}

// waitExit waits up to timeout for the daemon to be gone.
func (d *daemon) waitExit(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for d.alive() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// signal sends sig if the process still is the daemon.
func (d *daemon) signal(sig syscall.Signal) {
	if d.alive() {
		_ = syscall.Kill(d.pid, sig)
	}
}

// procStat returns the state letter and the start time of a process.
func procStat(pid int) (byte, uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state), field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: unexpected format", pid)
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	return f[0][0], start, err
}

// procAlive: the process runs and, if start is not 0, started at that time. A zombie leader
// whose other threads still exit (and may still hold /dev/fuse) counts as running.
func procAlive(pid int, start uint64) bool {
	st, s, err := procStat(pid)
	if err != nil || st == 'X' || st == 'x' || (start != 0 && s != start) {
		return false
	}
	if st == 'Z' {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		return err == nil && len(tasks) > 1
	}
	return true
}

// fileKey names a volume's files in StateDir.
func fileKey(volumeID string) string {
	sum := sha256.Sum256([]byte(volumeID))
	return hex.EncodeToString(sum[:16])
}

func (ns *NodeServer) statePath(id string) string {
	return filepath.Join(ns.cfg.StateDir, "volumes", fileKey(id)+".json")
}

func (ns *NodeServer) logPath(id string) string {
	return filepath.Join(ns.cfg.StateDir, "logs", fileKey(id)+".log")
}

func (ns *NodeServer) ephemeralDir(id string) string {
	return filepath.Join(ns.cfg.StateDir, "ephemeral", fileKey(id))
}

// saveState writes a state file atomically (temporary file, fsync, rename).
func (ns *NodeServer) saveState(st volState) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	p := ns.statePath(st.VolumeID)
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), p)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("state of volume %s: %w", st.VolumeID, err)
	}
	if d, err := os.Open(filepath.Dir(p)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

func (ns *NodeServer) removeState(id string) error {
	if err := os.Remove(ns.statePath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	// The daemon's log goes with the volume; what it said (I/O errors while an engine was
	// away, say) stays in the node plugin's log, where `kubectl logs` finds it afterwards.
	if tail := logTail(ns.logPath(id), 0); tail != "(no log)" && tail != "(nothing in the log)" {
		slog.Info("csi node: peregrine-fuse's last words", "volume", id, "tail", tail)
	}
	_ = os.Remove(ns.logPath(id))
	return nil
}

// loadStates reads every state file; unreadable ones are logged and skipped.
func (ns *NodeServer) loadStates() []volState {
	dir := filepath.Join(ns.cfg.StateDir, "volumes")
	ents, err := os.ReadDir(dir)
	if err != nil {
		slog.Error("csi node: reading volume states", "dir", dir, "err", err)
		return nil
	}
	var out []volState
	for _, e := range ents {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		p := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(p)
		var st volState
		if err == nil {
			err = json.Unmarshal(b, &st)
		}
		if err == nil && (st.VolumeID == "" || st.StagingPath == "") {
			err = errors.New("no volume ID or staging path")
		}
		if err != nil {
			slog.Error("csi node: skipping unreadable volume state", "file", p, "err", err)
			continue
		}
		if st.Targets == nil {
			st.Targets = map[string]pubTarget{}
		}
		out = append(out, st)
	}
	return out
}

// canonical resolves symbolic links in p's parent (never in p itself, which may be a dead
// mount), as /proc/self/mountinfo spells mount points.
func canonical(p string) string {
	p, err := filepath.Abs(p)
	if err != nil {
		return filepath.Clean(p)
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(p)); err == nil {
		return filepath.Join(dir, filepath.Base(p))
	}
	return p
}

// mountsAt lists the mounts stacked on p, the top one last.
func mountsAt(p string) ([]*mountinfo.Info, error) {
	return mountinfo.GetMounts(func(m *mountinfo.Info) (bool, bool) { return m.Mountpoint != p, false })
}

var errStatfsTimeout = errors.New("statfs did not answer")

// statfsWithin is statfs(2) that gives up waiting after d (the call itself may stay blocked).
func statfsWithin(p string, d time.Duration) (*syscall.Statfs_t, error) {
	type res struct {
		st  syscall.Statfs_t
		err error
	}
	ch := make(chan res, 1)
	go func() {
		var r res
		r.err = syscall.Statfs(p, &r.st)
		ch <- r
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, &os.PathError{Op: "statfs", Path: p, Err: r.err}
		}
		return &r.st, nil
	case <-time.After(d):
		return nil, fmt.Errorf("%s: %w within %s", p, errStatfsTimeout, d)
	}
}

type mountHealth int

const (
	mountAbsent  mountHealth = iota // nothing mounted on the path
	mountLive                       // a fuse.peregrine mount that answers
	mountDead                       // a mount that does not answer (ENOTCONN, ...)
	mountHung                       // a fuse.peregrine mount whose statfs does not come back
	mountForeign                    // another file system
)

// probeMount tells what is mounted on p (canonical) and, for a mount, its top entry.
func probeMount(p string) (mountHealth, *mountinfo.Info, error) {
	ms, err := mountsAt(p)
	if err != nil {
		return mountAbsent, nil, err
	}
	if len(ms) == 0 {
		return mountAbsent, nil, nil
	}
	top := ms[len(ms)-1]
	st, err := statfsWithin(p, statfsTimeout)
	switch {
	case errors.Is(err, errStatfsTimeout):
		return mountHung, top, err
	case err != nil:
		return mountDead, top, err
	case top.FSType != fuseFsType || st.Type != fuseSuperMagic:
		return mountForeign, top, nil
	}
	return mountLive, top, nil
}

// detach lazily unmounts every mount stacked on p.
func detach(p string) error { return unmountStack(p, true) }

// unmountAll unmounts every mount stacked on p, lazily when a plain unmount fails (busy, dead).
func unmountAll(p string) error { return unmountStack(p, false) }

func unmountStack(p string, lazy bool) error {
	for i := 0; i < 16; i++ {
		ms, err := mountsAt(p)
		if err != nil || len(ms) == 0 {
			return err
		}
		if !lazy {
			if err := syscall.Unmount(p, 0); err == nil {
				continue
			} else {
				slog.Info("csi node: unmount failed, detaching lazily", "path", p, "err", err)
			}
		}
		if err := syscall.Unmount(p, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			return fmt.Errorf("unmount %s: %w", p, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", p)
}

// bindMount binds src on dst (an existing directory), read-only if asked (a bind mount takes
// MS_RDONLY only in a remount).
func bindMount(src, dst string, ro bool) error {
	if err := syscall.Mount(src, dst, "", syscall.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind mount %s on %s: %w", src, dst, err)
	}
	if ro {
		flags := uintptr(syscall.MS_REMOUNT | syscall.MS_BIND | syscall.MS_RDONLY | syscall.MS_NOSUID | syscall.MS_NODEV)
		if err := syscall.Mount("", dst, "", flags, ""); err != nil {
			_ = detach(dst)
			return fmt.Errorf("remount %s read-only: %w", dst, err)
		}
	}
	return nil
}

// prepareMountpoint makes p an empty directory with nothing mounted on it: leftovers (a dead
// mount of a killed daemon, a mount nobody recorded) are detached lazily.
func prepareMountpoint(p string) error {
	if ms, err := mountsAt(p); err != nil {
		return err
	} else if len(ms) > 0 {
		slog.Warn("csi node: detaching a leftover mount", "path", p, "fstype", ms[len(ms)-1].FSType)
		if err := detach(p); err != nil {
			return err
		}
	}
	return os.MkdirAll(p, 0o750)
}

// startDaemon runs peregrine-fuse for st on st.StagingPath in its own session, its output to
// the volume's log, and waits until the path is a FUSE mount or the daemon exits.
func (ns *NodeServer) startDaemon(ctx context.Context, st *volState) (*daemon, error) {
	if err := prepareMountpoint(st.StagingPath); err != nil {
		return nil, status.Errorf(codes.Internal, "staging path %s: %v", st.StagingPath, err)
	}
	logPath := ns.logPath(st.VolumeID)
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "daemon log: %v", err)
	}
	var logStart int64
	if fi, err := logf.Stat(); err == nil {
		logStart = fi.Size()
	}
	fmt.Fprintf(logf, "--- %s: starting peregrine-fuse for volume %s on %s\n", time.Now().Format(time.RFC3339), st.VolumeID, st.StagingPath)
	opts := st.Opts
	if opts.IoUring == "" {
		opts.IoUring = ns.cfg.FuseIoUring
	}
	if opts.IoUring == IoUringAuto {
		allowFuseIoUring()
	}
	args := append(ns.securityArgs(), opts.args(ns.cfg.MgmtAddr, st.StagingPath)...)
	cmd := exec.Command(ns.cfg.FuseBin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	// Its own session: no signal to the plugin's process group reaches it. No Pdeathsig: it
	// outlives the plugin.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	_ = logf.Close()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "starting %s: %v", ns.cfg.FuseBin, err)
	}
	d := &daemon{pid: cmd.Process.Pid, exited: make(chan struct{})}
	var waitErr error
	go func() {
		waitErr = cmd.Wait()
		close(d.exited)
	}()
	if _, s, err := procStat(d.pid); err == nil {
		d.start = s
	}
	ns.moveToCgroups(d.pid)
	slog.Info("csi node: started peregrine-fuse", "volume", st.VolumeID, "pid", d.pid, "args", args)

	limit := mountTimeout
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < limit {
		limit = time.Until(dl)
	}
	for deadline := time.Now().Add(limit); ; {
		if ms, _ := mountsAt(st.StagingPath); len(ms) > 0 && strings.HasPrefix(ms[len(ms)-1].FSType, "fuse") {
			st.Pid, st.PidStart, st.Args = d.pid, d.start, args
			return d, nil
		}
		select {
		case <-d.exited:
			tail := logTail(logPath, logStart)
			slog.Error("csi node: peregrine-fuse exited before mounting", "volume", st.VolumeID, "pid", d.pid, "status", waitErr, "log", logPath, "tail", tail)
			return nil, status.Errorf(daemonErrorCode(tail), "peregrine-fuse for %s/%s exited (%v) before mounting %s: %s",
				st.Opts.Pool, st.Opts.Cont, waitErr, st.StagingPath, tail)
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			d.signal(syscall.SIGKILL)
			d.waitExit(2 * time.Second)
			_ = detach(st.StagingPath)
			code := codes.DeadlineExceeded
			if errors.Is(ctx.Err(), context.Canceled) {
				code = codes.Canceled
			}
			return nil, status.Errorf(code, "peregrine-fuse for %s/%s did not mount %s within %s: %s",
				st.Opts.Pool, st.Opts.Cont, st.StagingPath, limit.Round(time.Millisecond), logTail(logPath, logStart))
		}
	}
}

// daemonErrorCode maps the daemon's last words to a gRPC code.
func daemonErrorCode(tail string) codes.Code {
	l := strings.ToLower(tail)
	switch {
	case strings.Contains(l, "no such pool"), strings.Contains(l, "no such container"), strings.Contains(l, "not found"):
		return codes.NotFound
	case strings.Contains(l, "connection refused"), strings.Contains(l, "transport error"), strings.Contains(l, "unavailable"),
		strings.Contains(l, "timed out"):
		return codes.Unavailable
	case strings.Contains(l, "no file system in this container"):
		return codes.FailedPrecondition
	case strings.Contains(l, "permission denied"):
		return codes.PermissionDenied
	}
	return codes.Internal
}

// logTail is the last lines a daemon wrote to its log since offset from.
func logTail(path string, from int64) string {
	f, err := os.Open(path)
	if err != nil {
		return "(no log)"
	}
	defer f.Close()
	const max = 2048
	if fi, err := f.Stat(); err == nil && fi.Size()-from > max {
		from = fi.Size() - max
	}
	if _, err := f.Seek(from, io.SeekStart); err != nil {
		return "(no log)"
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if n := len(lines); n > 8 {
		lines = lines[n-8:]
	}
	var kept []string
	for _, l := range lines {
		if !strings.HasPrefix(l, "--- ") {
			kept = append(kept, strings.TrimSpace(l))
		}
	}
	if len(kept) == 0 {
		return "(nothing in the log)"
	}
	return strings.Join(kept, "; ")
}

// moveToCgroups writes pid into cgroup.procs of every cgroup directory in cfg.FuseCgroup
// (comma separated: one path per hierarchy with cgroup v1, one path with v2), best effort.
func (ns *NodeServer) moveToCgroups(pid int) {
	for _, cg := range strings.Split(ns.cfg.FuseCgroup, ",") {
		if cg = strings.TrimSpace(cg); cg == "" {
			continue
		}
		_ = os.Mkdir(cg, 0o755) // a cgroup is made by mkdir in its hierarchy
		inheritCpuset(cg)
		p := filepath.Join(cg, "cgroup.procs")
		f, err := os.OpenFile(p, os.O_WRONLY, 0)
		if err == nil {
			_, err = f.WriteString(strconv.Itoa(pid))
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			slog.Warn("csi node: cannot move peregrine-fuse out of the plugin's cgroup", "pid", pid, "cgroup", cg, "err", err)
		} else {
			slog.Info("csi node: moved peregrine-fuse to its cgroup", "pid", pid, "cgroup", cg)
		}
	}
}

// inheritCpuset gives a new cgroup v1 cpuset the CPUs and memory nodes of its parent: a cpuset
// starts with none, and the kernel refuses to move a process into it until it has them (left in
// the pod's cpuset, a daemon dies with the plugin's pod). Other hierarchies have no such files.
func inheritCpuset(cg string) {
	for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
		cur, err := os.ReadFile(filepath.Join(cg, f))
		if err != nil || strings.TrimSpace(string(cur)) != "" {
			continue
		}
		if parent, err := os.ReadFile(filepath.Join(filepath.Dir(cg), f)); err == nil {
			_ = os.WriteFile(filepath.Join(cg, f), parent, 0)
		}
	}
}

// stopDaemon ends a volume's daemon: SIGTERM (it unmounts the staging path and exits), up to
// stopTimeout, then SIGKILL; whatever is still mounted on the staging path is detached.
func stopDaemon(st volState, d *daemon) error {
	if d.alive() {
		d.signal(syscall.SIGTERM)
		if !d.waitExit(stopTimeout) {
			slog.Warn("csi node: peregrine-fuse did not exit after SIGTERM; killing it", "volume", st.VolumeID, "pid", d.pid)
			d.signal(syscall.SIGKILL)
			if !d.waitExit(2 * time.Second) {
				return fmt.Errorf("peregrine-fuse (pid %d) of volume %s does not exit", d.pid, st.VolumeID)
			}
		}
	}
	if ms, err := mountsAt(st.StagingPath); err == nil && len(ms) > 0 {
		if err := syscall.Unmount(st.StagingPath, syscall.MNT_FORCE|syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) {
			slog.Warn("csi node: forced unmount failed", "path", st.StagingPath, "err", err)
		}
	}
	return detach(st.StagingPath)
}

// healthy reports whether a volume's daemon runs and its staging mount answers.
func healthy(v *volume) (bool, string) {
	if !v.d.alive() {
		return false, fmt.Sprintf("peregrine-fuse (pid %d) is not running", v.st.Pid)
	}
	h, _, err := probeMount(v.st.StagingPath)
	switch h {
	case mountLive, mountHung:
		return true, ""
	case mountAbsent:
		return false, fmt.Sprintf("%s is not mounted", v.st.StagingPath)
	case mountForeign:
		return false, fmt.Sprintf("%s holds another file system", v.st.StagingPath)
	}
	return false, fmt.Sprintf("the mount does not answer: %v", err)
}

// restart brings a dead volume back (see the policy at the top of this file): the old daemon is
// killed if it still runs, the staging path and the targets are detached, a new daemon mounts
// the staging path and the targets are bound again.
func (ns *NodeServer) restart(ctx context.Context, v *volume, why string) error {
	slog.Warn("csi node: remounting volume", "volume", v.st.VolumeID, "why", why, "oldPid", v.st.Pid)
	if v.d.alive() {
		v.d.signal(syscall.SIGKILL)
		v.d.waitExit(2 * time.Second)
	}
	for t := range v.st.Targets {
		if err := detach(t); err != nil {
			slog.Warn("csi node: detaching a dead publish target", "target", t, "err", err)
		}
	}
	if err := detach(v.st.StagingPath); err != nil {
		return status.Errorf(codes.Internal, "staging path of %s: %v", v.st.VolumeID, err)
	}
	st := v.clone()
	d, err := ns.startDaemon(ctx, &st)
	if err != nil {
		return err
	}
	ns.update(v, st, d)
	if err := ns.saveState(st); err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	return ns.repairTargets(v)
}

// repairTargets binds again the recorded targets of a live volume whose bind mount is missing
// or dead, and forgets those whose directory is gone.
func (ns *NodeServer) repairTargets(v *volume) error {
	stagingTop, _ := mountsAt(v.st.StagingPath)
	var errs []error
	st := v.clone()
	changed := false
	targets := make([]string, 0, len(st.Targets))
	for t := range st.Targets {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	for _, t := range targets {
		h, top, _ := probeMount(t)
		if h == mountLive && len(stagingTop) > 0 && top.Major == stagingTop[len(stagingTop)-1].Major && top.Minor == stagingTop[len(stagingTop)-1].Minor {
			continue
		}
		if h != mountAbsent {
			if err := detach(t); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if _, err := os.Lstat(t); errors.Is(err, os.ErrNotExist) {
			slog.Info("csi node: forgetting a publish target whose directory is gone", "volume", st.VolumeID, "target", t)
			delete(st.Targets, t)
			changed = true
			continue
		}
		if err := bindMount(st.StagingPath, t, st.Targets[t].ReadOnly); err != nil {
			errs = append(errs, err)
			continue
		}
		slog.Info("csi node: bound publish target again", "volume", st.VolumeID, "target", t)
	}
	if changed {
		ns.update(v, st, v.d)
		if err := ns.saveState(st); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return status.Errorf(codes.Internal, "publish targets of %s: %v", st.VolumeID, err)
	}
	return nil
}

// readopt takes over a volume found in StateDir (see the policy at the top of this file).
func (ns *NodeServer) readopt(ctx context.Context, st volState) {
	v := &volume{st: st, d: &daemon{pid: st.Pid, start: st.PidStart}}
	ns.putVolume(v)
	if ok, why := healthy(v); ok {
		slog.Info("csi node: adopted a running peregrine-fuse", "volume", st.VolumeID, "pid", st.Pid, "staging", st.StagingPath)
		if err := ns.repairTargets(v); err != nil {
			slog.Error("csi node: re-adoption", "volume", st.VolumeID, "err", err)
		}
		return
	} else if st.Ephemeral != nil && len(st.Targets) == 0 {
		// An inline volume published nowhere: its next publish mounts it, its unpublish
		// deletes it; nothing to serve meanwhile.
		slog.Info("csi node: inline volume not published; not remounting it", "volume", st.VolumeID, "why", why)
		return
	} else if err := ns.restart(ctx, v, why); err != nil {
		slog.Error("csi node: cannot remount volume; the next stage or publish tries again", "volume", st.VolumeID, "err", err)
	}
}

// heal makes a recorded volume live again if it is dead (stage and publish call it).
func (ns *NodeServer) heal(ctx context.Context, v *volume) error {
	if ok, why := healthy(v); !ok {
		return ns.restart(ctx, v, why)
	}
	return nil
}
