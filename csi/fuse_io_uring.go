package csi

import (
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"syscall"
)

// IoUringMode is how a volume's FUSE daemon takes the kernel's requests (peregrine-fuse
// --io-uring): over FUSE over io_uring (Linux 6.14+ built with CONFIG_FUSE_IO_URING: a ring per
// CPU, each reply and the wait for the next request one system call) or over /dev/fuse.
type IoUringMode string

const (
	// IoUringAuto: over io_uring where the node's kernel has it, else /dev/fuse. The node
	// plugin turns the kernel's switch on first (allowFuseIoUring).
	IoUringAuto IoUringMode = "auto"
	// IoUringOn: over io_uring only; the mount fails on a kernel without it.
	IoUringOn IoUringMode = "on"
	// IoUringOff: over /dev/fuse.
	IoUringOff IoUringMode = "off"
)

func parseIoUring(v string) (IoUringMode, bool) {
	switch m := IoUringMode(strings.ToLower(strings.TrimSpace(v))); m {
	case IoUringAuto, IoUringOn, IoUringOff:
		return m, true
	}
	return "", false
}

// fuseIoUringSwitch is the fuse module's switch for FUSE over io_uring. It only lets daemons
// ask for it at their INIT; a daemon that does not ask keeps /dev/fuse.
const fuseIoUringSwitch = "/sys/module/fuse/parameters/enable_uring"

// allowFuseIoUring turns the kernel's switch on where the kernel has one. It is the node's, for
// every FUSE mount on it: the node plugin, which owns the node's FUSE mounts of Peregrine, sets
// it, where a daemon started by hand with auto leaves it as it finds it. A failure is logged and
// the daemon serves /dev/fuse.
func allowFuseIoUring() {
	b, err := os.ReadFile(fuseIoUringSwitch)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return // a kernel without FUSE over io_uring (or no fuse module yet): /dev/fuse
	case err != nil:
	case strings.TrimSpace(string(b)) == "Y":
		return
	default:
		if err = os.WriteFile(fuseIoUringSwitch, []byte("Y"), 0); err == nil {
			slog.Info("csi node: turned on FUSE over io_uring", "switch", fuseIoUringSwitch)
			return
		}
	}
	slog.Warn("csi node: FUSE over io_uring stays off; the daemons serve /dev/fuse", "switch", fuseIoUringSwitch, "error", err)
}

// daemonGone: what a mount whose daemon is gone answers: ENOTCONN. Over FUSE over io_uring,
// until the dead daemon's rings are torn down, ECONNABORTED (a request the connection's abort
// catches) or ECANCELED (one handed to a dead ring entry: the kernel's fuse_uring_send_in_task).
func daemonGone(err error) bool {
	return errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) ||
		errors.Is(err, syscall.ECANCELED)
}
