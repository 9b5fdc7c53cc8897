package ilcheck

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
)

// The check is run as a check container runs it: the static checker, the library and ISA-L in
// /opt/peregrine/il-host of a root file system standing for an image, chrooted into it. The roots
// (hack/il-test-roots.sh) carry real C libraries: Debian 11's glibc 2.31 (older than the library
// needs), this machine's, musl, and none. Then the workload is started the way the webhook sets it
// up, with LD_PRELOAD naming /opt/peregrine/il/libperegrine_il.so, and must start (and, where the
// check said on, bind the library) with nothing printed by the loader.

var (
	setupOnce  sync.Once
	rootsDir   string
	checkerBin string
	setupErr   error
)

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// interceptionLibrary is the library the Rust workspace built (make test builds it before the Go
// tests; PEREGRINE_IL_LIB names another).
func interceptionLibrary(t *testing.T) string {
	lib := os.Getenv("PEREGRINE_IL_LIB")
	if lib == "" {
		lib = filepath.Join(repoRoot(), "engine", "target", "debug", Library)
	}
	if _, err := os.Stat(lib); err != nil {
		t.Fatalf("the interception library %s is missing (cd engine && cargo build --workspace): %v", lib, err)
	}
	return lib
}

func setup(t *testing.T) (string, string) {
	if os.Geteuid() != 0 {
		t.Skip("chroot and the test roots need root")
	}
	setupOnce.Do(func() {
		out, err := exec.Command("bash", filepath.Join(repoRoot(), "hack", "il-test-roots.sh")).Output()
		if err != nil {
			setupErr = err
			if ee, ok := err.(*exec.ExitError); ok {
				setupErr = &exec.ExitError{ProcessState: ee.ProcessState, Stderr: ee.Stderr}
			}
			return
		}
		rootsDir = strings.TrimSpace(string(out))
		dir, err := os.MkdirTemp("", "il-check")
		if err != nil {
			setupErr = err
			return
		}
		checkerBin = filepath.Join(dir, "peregrine-il-check")
		build := exec.Command("go", "build", "-o", checkerBin, "./cmd/il-check")
		build.Dir = repoRoot()
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		if b, err := build.CombinedOutput(); err != nil {
			setupErr = err
			t.Logf("go build: %s", b)
		}
	})
	if setupErr != nil {
		t.Fatalf("setting up the test roots: %v", setupErr)
	}
	return rootsDir, checkerBin
}

// prepare empties the root's two directories and installs the node's files, as the node plugin's
// install step and the webhook's volumes do.
func prepare(t *testing.T, root, checker string) {
	t.Helper()
	host, out := filepath.Join(root, "opt/peregrine/il-host"), filepath.Join(root, "opt/peregrine/il")
	for _, d := range []string{host, out} {
		if err := os.RemoveAll(d); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	isal, err := filepath.EvalSymlinks("/usr/lib/x86_64-linux-gnu/libisal.so.2")
	if err != nil {
		t.Fatalf("ISA-L: %v", err)
	}
	for src, name := range map[string]string{checker: "peregrine-il-check", interceptionLibrary(t): Library, isal: ISAL} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(host, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// inRoot runs argv chrooted into root with env; it returns stdout, stderr and the exit error.
func inRoot(root string, env []string, argv ...string) (string, string, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root}
	cmd.Dir = "/"
	cmd.Env = env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

func TestCheckInImages(t *testing.T) {
	roots, checker := setup(t)
	preload := "LD_PRELOAD=/opt/peregrine/il/" + Library
	for _, tc := range []struct {
		root   string
		on     bool
		reason string // in the printed line when off
		// program is started as the workload; it must exit 0 with an empty stderr.
		program string
	}{
		{root: "glibc-host", on: true, program: "/bin/true"},
		{root: "glibc-2.31", reason: "version `GLIBC_2.3", program: "/bin/cat"},
		{root: "musl", reason: "is not glibc (/bin/true uses /lib/ld-musl-x86_64.so.1)", program: "/bin/true"},
		{root: "static", reason: "only statically linked programs", program: "/bin/sh"},
	} {
		t.Run(tc.root, func(t *testing.T) {
			root := filepath.Join(roots, tc.root)
			prepare(t, root, checker)
			stdout, stderr, err := inRoot(root, nil, "/opt/peregrine/il-host/peregrine-il-check",
				"--from", "/opt/peregrine/il-host", "--to", "/opt/peregrine/il")
			if err != nil || stderr != "" {
				t.Fatalf("check: %v, stderr %q", err, stderr)
			}
			line := strings.TrimSpace(stdout)
			if strings.Count(stdout, "\n") != 1 {
				t.Errorf("check printed %q, want one line", stdout)
			}
			if got := strings.HasPrefix(line, "peregrine-il: interception on: "); got != tc.on {
				t.Fatalf("check printed %q, want on=%v", line, tc.on)
			}
			if !tc.on && !strings.Contains(line, tc.reason) {
				t.Errorf("check printed %q, want the reason %q", line, tc.reason)
			}
			_, err = os.Lstat(filepath.Join(root, "opt/peregrine/il", ISAL))
			if has := err == nil; has != tc.on {
				t.Errorf("ISA-L handed over: %v, want %v", has, tc.on)
			}

			// The workload as the webhook starts it: it runs, and the loader says nothing.
			_, stderr, err = inRoot(root, []string{preload}, tc.program, "/dev/null")
			if err != nil || stderr != "" {
				t.Errorf("workload %s with %s: %v, stderr %q", tc.program, preload, err, stderr)
			}
			if tc.on {
				// And it has the library: its constructor answers the probe from the copy.
				_, stderr, err = inRoot(root, []string{preload, "PEREGRINE_IL_PROBE=/tmp/answer"}, tc.program)
				b, rerr := os.ReadFile(filepath.Join(root, "tmp/answer"))
				if err != nil || rerr != nil || string(b) != probeAnswer {
					t.Errorf("the copied library did not bind: %v %v %q, stderr %q", err, rerr, b, stderr)
				}
				_ = os.Remove(filepath.Join(root, "tmp/answer"))
			}
		})
	}
}

// A node without the library (the node plugin not yet running): off, and the glibc workload
// still starts silently.
func TestCheckWithoutTheLibrary(t *testing.T) {
	roots, checker := setup(t)
	root := filepath.Join(roots, "glibc-host")
	prepare(t, root, checker)
	if err := os.Remove(filepath.Join(root, "opt/peregrine/il-host", Library)); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := inRoot(root, nil, "/opt/peregrine/il-host/peregrine-il-check")
	if err != nil || !strings.Contains(stdout, "interception off: the node has no interception library") {
		t.Fatalf("check: %v, %q", err, stdout)
	}
	if _, stderr, err := inRoot(root, []string{"LD_PRELOAD=/opt/peregrine/il/" + Library}, "/bin/true"); err != nil || stderr != "" {
		t.Errorf("workload: %v, stderr %q", err, stderr)
	}
}

// The program named first (the container's command) is the one probed.
func TestCheckProbesTheContainersProgramFirst(t *testing.T) {
	roots, checker := setup(t)
	root := filepath.Join(roots, "glibc-2.31")
	prepare(t, root, checker)
	stdout, _, err := inRoot(root, nil, "/opt/peregrine/il-host/peregrine-il-check", "--program", "/bin/cat", "--program", "/nonexistent")
	if err != nil || !strings.Contains(stdout, "(probed with /bin/cat)") && !strings.Contains(stdout, "/bin/cat:") {
		t.Fatalf("check: %v, %q", err, stdout)
	}
}
