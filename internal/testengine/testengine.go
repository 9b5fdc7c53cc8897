// Package testengine runs real peregrine-engine processes for Go tests: a system of one or more
// engines on sparse device files, formatted and ready for pools. It is test support shared by the
// CSI driver's suites; nothing in it is a fake.
package testengine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// System is a running set of engines; rank 0 hosts the management service. Its control plane
// runs with mutual TLS from a CA made for it (pkg/pki, as the operator makes them).
type System struct {
	Name    string
	Dir     string
	Engines []*exec.Cmd
	// MgmtAddr is the management service's address (host:port).
	MgmtAddr string
	// AdminTLSDir and ClientTLSDir hold certificates of the system's CA for the roles admin
	// and client (ca.crt, tls.crt, tls.key), for the clients a test starts; both "" when the
	// engine has no TLS (KnowsTLS): clients then talk without it.
	AdminTLSDir, ClientTLSDir string
	conn                      *grpc.ClientConn
}

// KnowsTLS reports whether the engine binary bin has TLS on its control plane (its configuration
// knows tls_dir and allow_insecure). Engines built before it refuse both keys, and their clients
// speak plain HTTP/2 only: the tests then run without TLS, as before (the transition while the
// engine side lands; a binary is read once).
func KnowsTLS(bin string) bool {
	knowsMu.Lock()
	defer knowsMu.Unlock()
	if k, ok := knows[bin]; ok {
		return k
	}
	b, err := os.ReadFile(bin)
	k := err == nil && bytes.Contains(b, []byte("allow_insecure"))
	knows[bin] = k
	return k
}

var (
	knowsMu sync.Mutex
	knows   = map[string]bool{}
)

// writeTLSDir writes a certificate of ca for id into dir.
func writeTLSDir(dir string, ca *pki.CA, id pki.Identity) error {
	leaf, err := ca.Issue(id, time.Now(), 24*time.Hour)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for f, b := range map[string][]byte{pki.CAFile: ca.CertPEM(), pki.CertFile: leaf.CertPEM, pki.KeyFile: leaf.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			return err
		}
	}
	return nil
}

// EngineBin is the engine binary: PEREGRINE_ENGINE_BIN, else engine/target/debug/peregrine-engine
// found upwards from the working directory.
func EngineBin() (string, error) {
	if b := os.Getenv("PEREGRINE_ENGINE_BIN"); b != "" {
		return b, nil
	}
	return findUp(filepath.Join("engine", "target", "debug", "peregrine-engine"))
}

// Bin finds another binary of the engine workspace (peregrine-fuse, libperegrine_il.so) next to
// the engine binary.
func Bin(name string) (string, error) {
	e, err := EngineBin()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(e), name)
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("%s: %w (build the engine workspace: cd engine && cargo build --workspace)", p, err)
	}
	return p, nil
}

func findUp(rel string) (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(d, rel)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", fmt.Errorf("%s not found above the working directory; build it (cd engine && cargo build --workspace) or set PEREGRINE_ENGINE_BIN", rel)
		}
		d = up
	}
}

var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// FreePort is a loopback port nothing listens on, never the same twice in this process.
func FreePort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if !ports[p] {
			ports[p] = true
			return p, nil
		}
	}
}

// Start runs `engines` engines (2 targets each, 256 MiB of RAM metadata and a sparse device file
// of deviceSize bytes each) under dir, waits for them to join and formats their storage.
func Start(name, dir string, engines int, deviceSize int64) (*System, error) {
	bin, err := EngineBin()
	if err != nil {
		return nil, err
	}
	s := &System{Name: name, Dir: dir}
	tls := KnowsTLS(bin)
	ca, err := pki.NewCA(name, time.Now(), 48*time.Hour)
	if err != nil {
		return nil, err
	}
	if tls {
		s.AdminTLSDir, s.ClientTLSDir = filepath.Join(dir, "admin-tls"), filepath.Join(dir, "client-tls")
		if err := writeTLSDir(s.AdminTLSDir, ca, pki.Identity{System: name, Role: pki.RoleAdmin, Name: "test"}); err != nil {
			return nil, err
		}
		if err := writeTLSDir(s.ClientTLSDir, ca, pki.Identity{System: name, Role: pki.RoleClient, Name: "test"}); err != nil {
			return nil, err
		}
	}
	type ep struct{ cp, dp int }
	eps := make([]ep, engines)
	for i := range eps {
		if eps[i].cp, err = FreePort(); err != nil {
			return nil, err
		}
		if eps[i].dp, err = FreePort(); err != nil {
			return nil, err
		}
	}
	s.MgmtAddr = fmt.Sprintf("127.0.0.1:%d", eps[0].cp)
	for i, p := range eps {
		edir := filepath.Join(dir, fmt.Sprintf("%s-%d", name, i))
		if err := os.MkdirAll(edir, 0o755); err != nil {
			return nil, err
		}
		tlsLine := ""
		if tls {
			tlsDir := filepath.Join(edir, "tls")
			if err := writeTLSDir(tlsDir, ca, pki.EngineIdentity(name, int32(i))); err != nil {
				return nil, err
			}
			tlsLine = "tls_dir: " + tlsDir + "\n"
		}
		device := filepath.Join(edir, "nvme.img")
		f, err := os.Create(device)
		if err != nil {
			return nil, err
		}
		if err := f.Truncate(deviceSize); err != nil {
			return nil, err
		}
		_ = f.Close()
		cfg := fmt.Sprintf("name: %s\nrank: %d\nfault_domain: /host%d\ncontrol_port: %d\ndata_port: %d\ntargets: 2\nhugepages: false\n"+
			"scm: {class: ram, size: 256MiB}\nbdev: {class: file, path: %s, size: %d}\nmgmt_svc_replicas: [%q]\n"+
			"log_level: info\nlog_file: %s\n%s", name, i, i, p.cp, p.dp, device, deviceSize, s.MgmtAddr, filepath.Join(edir, "engine.log"), tlsLine)
		cfgPath := filepath.Join(edir, "engine.yaml")
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return nil, err
		}
		out, err := os.Create(filepath.Join(edir, "engine.out"))
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(bin, "--config", cfgPath)
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			_ = out.Close()
			s.Stop()
			return nil, err
		}
		_ = out.Close()
		s.Engines = append(s.Engines, cmd)
	}
	creds := insecure.NewCredentials()
	if tls {
		creds = pki.Credentials(pki.DirSource(s.AdminTLSDir))
	}
	if s.conn, err = grpc.NewClient(s.MgmtAddr, grpc.WithTransportCredentials(creds)); err != nil {
		s.Stop()
		return nil, err
	}
	if err := s.waitMembers(engines, mgmtpb.MemberState_MEMBER_STATE_UNSPECIFIED, 60*time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := s.Mgmt().StorageFormat(ctx, &mgmtpb.StorageFormatReq{}); err != nil {
		s.Stop()
		return nil, fmt.Errorf("storage format: %w", err)
	}
	if err := s.waitMembers(engines, mgmtpb.MemberState_MEMBER_STATE_JOINED, 60*time.Second); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// Mgmt is a client of the system's management service.
func (s *System) Mgmt() mgmtpb.MgmtClient { return mgmtpb.NewMgmtClient(s.conn) }

// waitMembers waits until n ranks are members of the system in the given state (unspecified: any).
func (s *System) waitMembers(n int, state mgmtpb.MemberState, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last string
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		r, err := s.Mgmt().SystemQuery(ctx, &mgmtpb.SystemQueryReq{})
		cancel()
		if err == nil {
			ready := 0
			var states []string
			for _, m := range r.Members {
				states = append(states, fmt.Sprintf("%d:%s", m.Rank, m.State.Word()))
				if state == mgmtpb.MemberState_MEMBER_STATE_UNSPECIFIED || m.State == state {
					ready++
				}
			}
			if ready >= n {
				return nil
			}
			last = strings.Join(states, " ")
		} else {
			last = err.Error()
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("engines of %s did not join in %s (last: %s); logs under %s", s.Name, timeout, last, s.Dir)
}

// Stop kills every engine and waits for them.
func (s *System) Stop() {
	for _, c := range s.Engines {
		if c.Process != nil {
			_ = c.Process.Kill()
			_ = c.Wait()
		}
	}
	if s.conn != nil {
		_ = s.conn.Close()
	}
}

// ErrNoFuse is returned by CheckFuse where FUSE mounts cannot be made.
var ErrNoFuse = errors.New("FUSE unavailable")

// CheckFuse reports whether this process can make FUSE mounts (root and /dev/fuse).
func CheckFuse() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: not root", ErrNoFuse)
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("%w: %v", ErrNoFuse, err)
	}
	return nil
}
