package controllers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// engineProcess is one real peregrine-engine on a sparse device file, hosting its own
// management service (a one-engine system), as engine/crates/engine/tests/common does.
type engineProcess struct {
	name string
	addr string
	dir  string
	cmd  *exec.Cmd
}

var (
	enginesMu sync.Mutex
	engines   []*engineProcess
)

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	Expect(err).NotTo(HaveOccurred())
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startEngine starts an unformatted engine of system `name`; foreign puts non-zero bytes on its
// device first, so that the engine sees a foreign signature.
func startEngine(name string, foreign bool) *engineProcess {
	dir := filepath.Join(workDir, name)
	Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
	device := filepath.Join(dir, "nvme.img")
	f, err := os.Create(device)
	Expect(err).NotTo(HaveOccurred())
	Expect(f.Truncate(256 << 20)).To(Succeed())
	if foreign {
		_, err = f.WriteAt([]byte("not peregrine"), 5000)
		Expect(err).NotTo(HaveOccurred())
	}
	Expect(f.Close()).To(Succeed())
	cp, dp := freePort(), freePort()
	addr := fmt.Sprintf("127.0.0.1:%d", cp)
	cfg := fmt.Sprintf("name: %s\nrank: 0\nfault_domain: /host0\ncontrol_port: %d\ndata_port: %d\ntargets: 2\nhugepages: false\n"+
		"scm: {class: ram, size: 256MiB}\nbdev: {class: file, path: %s, size: 256MiB}\nmgmt_svc_replicas: [%q]\n"+
		"log_level: info\nlog_file: %s\n", name, cp, dp, device, addr, filepath.Join(dir, "engine.log"))
	cfgPath := filepath.Join(dir, "engine.yaml")
	Expect(os.WriteFile(cfgPath, []byte(cfg), 0o644)).To(Succeed())
	out, err := os.Create(filepath.Join(dir, "engine.out"))
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(engineBin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = out, out
	Expect(cmd.Start()).To(Succeed())
	e := &engineProcess{name: name, addr: addr, dir: dir, cmd: cmd}
	enginesMu.Lock()
	engines = append(engines, e)
	enginesMu.Unlock()

	ms := msClient(addr)
	Eventually(func() ([]*mgmtpb.Member, error) {
		r, err := ms.SystemQuery(context.Background(), &mgmtpb.SystemQueryReq{})
		if err != nil {
			return nil, err
		}
		return r.Members, nil
	}, 60*time.Second, 100*time.Millisecond).Should(HaveLen(1), "engine %s did not join; see %s", name, dir)
	return e
}

var testMS = &ManagementServices{CallTimeout: 30 * time.Second}

func msClient(addr string) mgmtpb.MgmtClient {
	c, err := testMS.Client(addr)
	Expect(err).NotTo(HaveOccurred())
	return c
}

func stopAllEngines() {
	enginesMu.Lock()
	defer enginesMu.Unlock()
	for _, e := range engines {
		if e.cmd.Process != nil {
			_ = e.cmd.Process.Kill()
			_, _ = e.cmd.Process.Wait()
		}
	}
	engines = nil
	testMS.Close()
	GinkgoWriter.Println("engines stopped")
}
