// Package ilcheck decides, inside a workload's own image, whether that image's C library binds
// Peregrine's interception library, and hands the library over only when it does.
//
// The library is a glibc shared object. Where a loader finds it and cannot bind it (glibc older
// than the library needs: a missing symbol version; musl: missing glibc symbols), the failure is
// fatal and the program does not start; where the file named by LD_PRELOAD does not exist, every
// loader ignores it. So the webhook points LD_PRELOAD at a directory that holds the library only
// if this check, run by an init container in the same image, saw the image's own loader bind it.
//
// The check runs a dynamically linked glibc program of the image with the library preloaded and
// PEREGRINE_IL_PROBE set: the library's constructor, which runs only once the loader has bound
// it, writes the answer and ends the process before the program's main. Either the loader stops
// with an error or the constructor answers: the program itself never runs. Programs of another
// loader (musl) are not run at all.
package ilcheck

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

const (
	// Library is the interception library's file name.
	Library = "libperegrine_il.so"
	// ISAL is the library's one dependency that images rarely have; it goes beside the library,
	// which finds it there (RUNPATH $ORIGIN).
	ISAL = "libisal.so.2"

	probeEnv  = "PEREGRINE_IL_PROBE"
	probeFile = ".peregrine-il-probe"
	// probeAnswer is what the library's constructor writes (engine/crates/il, answer_probe).
	probeAnswer = "peregrine-il bound\n"
	// probeTimeout bounds a probe; the constructor answers in microseconds.
	probeTimeout = 10 * time.Second
	// maxScanned bounds the directory entries looked at for a program, so that a huge bin
	// directory cannot stall the pod's start.
	maxScanned = 4096
	// maxStderr bounds what is kept of a failed probe's messages.
	maxStderr = 4096
)

// wellKnown are the programs tried first after the container's own: small ones that nearly every
// image with a C library has.
var wellKnown = []string{"/bin/true", "/usr/bin/true", "/bin/sh", "/usr/bin/sh", "/usr/bin/env", "/bin/ls", "/usr/bin/ls"}

// scanDirs are searched, in order, when none of those is a dynamically linked program.
var scanDirs = []string{"/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"}

// Result is the check's answer.
type Result struct {
	// On: the library and ISA-L are in the target directory.
	On bool
	// Program and Loader were used for the probe (empty when none was found).
	Program, Loader string
	// Reason says why interception is off.
	Reason string
}

// String is the one line the check container prints.
func (r Result) String() string {
	if r.On {
		return fmt.Sprintf("peregrine-il: interception on: %s binds the library (probed with %s)", r.Loader, r.Program)
	}
	return "peregrine-il: interception off: " + r.Reason +
		"; the container runs without it (its I/O takes the kernel FUSE path, with the same results)"
}

// Check probes with the first usable program (programs first, then well-known ones, then the
// bin directories) whether the image binds from/Library, and on success copies the library and
// ISA-L into to. Paths are those of the running image.
func Check(from, to string, programs ...string) Result {
	// Anything left from an earlier run of this pod must not outlive a negative answer.
	for _, f := range []string{Library, ISAL, probeFile} {
		_ = os.Remove(filepath.Join(to, f))
	}
	prog, loader, why := findProgram(programs)
	if prog == "" {
		// No glibc loader reads LD_PRELOAD here; others ignore a missing file silently.
		return Result{Reason: why}
	}
	r := Result{Program: prog, Loader: loader}
	lib := filepath.Join(from, Library)
	if _, err := os.Stat(lib); err != nil {
		r.Reason = fmt.Sprintf("the node has no interception library (%v): is the CSI node plugin running on this node?", err)
	} else if err := probe(lib, prog, filepath.Join(to, probeFile)); err != nil {
		r.Reason = fmt.Sprintf("the image's loader %s does not bind the library: %v", loader, err)
	} else if err := copyFiles(from, to, ISAL, Library); err != nil {
		r.Reason = err.Error()
	} else {
		r.On = true
		return r
	}
	// glibc prints an error for a missing LD_PRELOAD file at every program start. The image's own
	// libc.so.6, preloaded under the library's name, is the object every program loads anyway
	// (the loader recognises the same file), so nothing is printed or changed. (Its loader would
	// do as well on glibc 2.31, but glibc 2.36 crashes preloading itself.)
	if libc, err := libcOf(prog); err != nil {
		r.Reason += fmt.Sprintf(" (and no stand-in for the library: %v)", err)
	} else if err := os.Symlink(libc, filepath.Join(to, Library)); err != nil {
		r.Reason += fmt.Sprintf(" (and no stand-in for the library: %v)", err)
	}
	return r
}

// libcOf asks prog's loader which libc.so.6 it binds prog to (what ldd asks it).
func libcOf(prog string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog)
	cmd.Env = []string{"LD_TRACE_LOADED_OBJECTS=1"}
	var stdout bytes.Buffer
	cmd.Stdout = &limitedWriter{w: &stdout, n: 64 << 10}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("listing the libraries of %s: %v", prog, err)
	}
	for _, l := range strings.Split(stdout.String(), "\n") {
		// "	libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f...)"
		name, rest, ok := strings.Cut(strings.TrimSpace(l), " => ")
		if !ok || name != "libc.so.6" {
			continue
		}
		if path, _, ok := strings.Cut(rest, " ("); ok && filepath.IsAbs(path) {
			return path, nil
		}
	}
	return "", fmt.Errorf("the loader names no libc.so.6 for %s", prog)
}

// copyFiles copies names from one directory to the other, none or all.
func copyFiles(from, to string, names ...string) error {
	for _, f := range names {
		if err := copyFile(filepath.Join(from, f), filepath.Join(to, f)); err != nil {
			for _, g := range names {
				_ = os.Remove(filepath.Join(to, g))
			}
			return fmt.Errorf("copying %s: %v", f, err)
		}
	}
	return nil
}

// findProgram returns a dynamically linked program whose loader is glibc's, with that loader;
// or, when there is none, why interception cannot be on.
func findProgram(first []string) (prog, loader, why string) {
	var musl, static string
	consider := func(p string) bool {
		kind, interp := classify(p)
		switch kind {
		case glibcProgram:
			prog, loader = p, interp
			return true
		case muslProgram:
			if musl == "" {
				musl = p + " uses " + interp
			}
		case staticProgram:
			if static == "" {
				static = p
			}
		}
		return false
	}
	for _, p := range append(append([]string{}, first...), wellKnown...) {
		if consider(p) {
			return prog, loader, ""
		}
	}
	scanned := 0
	for _, dir := range scanDirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range entries {
			if scanned++; scanned > maxScanned {
				break
			}
			if e.Type().IsRegular() && consider(filepath.Join(dir, e.Name())) {
				return prog, loader, ""
			}
		}
	}
	switch {
	case musl != "":
		return "", "", "the image's C library is not glibc (" + musl + "), and the library needs glibc"
	case static != "":
		return "", "", "the image has only statically linked programs (such as " + static + "), which ignore LD_PRELOAD"
	default:
		return "", "", "the image has no program to probe with"
	}
}

type programKind int

const (
	notAProgram programKind = iota
	staticProgram
	glibcProgram
	muslProgram
)

// classify reads p's ELF headers: static, or dynamic with which loader (only when the loader
// exists in the image and the program is for this machine's architecture, like the library).
func classify(p string) (programKind, string) {
	if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return notAProgram, ""
	}
	f, err := elf.Open(p)
	if err != nil {
		return notAProgram, ""
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return notAProgram, ""
	}
	if f.Machine != hostMachine() {
		return notAProgram, ""
	}
	for _, ph := range f.Progs {
		if ph.Type != elf.PT_INTERP {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(ph.Open(), 4096))
		if err != nil {
			return notAProgram, ""
		}
		interp := string(bytes.TrimRight(b, "\x00"))
		if _, err := os.Stat(interp); err != nil {
			return notAProgram, ""
		}
		base := filepath.Base(interp)
		switch {
		case strings.HasPrefix(base, "ld-musl"):
			return muslProgram, interp
		case strings.HasPrefix(base, "ld-linux"):
			return glibcProgram, interp
		default:
			return notAProgram, "" // a loader of neither kind: nothing to probe with
		}
	}
	if f.Type == elf.ET_DYN {
		return notAProgram, "" // a shared object, not a program
	}
	return staticProgram, ""
}

// probe runs prog with lib preloaded and asks the library's constructor to answer in answer.
func probe(lib, prog, answer string) error {
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LD_PRELOAD=" + lib, probeEnv + "=" + answer}
	var stderr bytes.Buffer
	cmd.Stderr = &limitedWriter{w: &stderr, n: maxStderr}
	runErr := cmd.Run()
	got, err := os.ReadFile(answer)
	_ = os.Remove(answer)
	if err == nil && string(got) == probeAnswer {
		return nil
	}
	if msg := firstLine(stderr.String()); msg != "" {
		return errors.New(msg)
	}
	if runErr != nil {
		return fmt.Errorf("%s: %v", prog, runErr)
	}
	return fmt.Errorf("%s ran without the library's constructor answering", prog)
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			if len(l) > 300 {
				l = l[:300] + "..."
			}
			return l
		}
	}
	return ""
}

// copyFile copies src to dst through a temporary file and a rename, so that a container never
// sees half a library.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".new"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	keep := p
	if len(keep) > l.n {
		keep = keep[:l.n]
	}
	l.n -= len(keep)
	if len(keep) > 0 {
		if _, err := l.w.Write(keep); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// hostMachine is the ELF machine of this build, which is the library's (the checker ships with it
// in the same node image).
func hostMachine() elf.Machine {
	switch runtime.GOARCH {
	case "arm64":
		return elf.EM_AARCH64
	default:
		return elf.EM_X86_64
	}
}
