package controllers

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// engineProcess is one real peregrine-engine on a sparse device file: either a one-engine
// system hosting its own management service, as engine/crates/engine/tests/common does
// (startEngine), or one pod of a ServerSet's StatefulSet run from the operator's rendered
// ConfigMap (startEnginePod).
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

var (
	portsMu sync.Mutex
	ports   = map[int]bool{}
)

// freePort is a loopback port nothing listens on, never the same twice in this process (the
// kernel may hand a just-released port out again).
func freePort() int {
	portsMu.Lock()
	defer portsMu.Unlock()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		p := l.Addr().(*net.TCPAddr).Port
		Expect(l.Close()).To(Succeed())
		if !ports[p] {
			ports[p] = true
			return p
		}
	}
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
	// The ServerSet of the same name adopts this CA (its Secret made here, before the ServerSet).
	tlsLine := ""
	if engineTLS {
		ca := testCA(name)
		tlsDir := filepath.Join(dir, "tls")
		writeTLSDir(tlsDir, ca, pki.EngineIdentity(name, 0))
		writeTLSDir(filepath.Join(dir, "admin-tls"), ca, pki.Identity{System: name, Role: pki.RoleAdmin, Name: "test"})
		tlsLine = "tls_dir: " + tlsDir + "\n"
	}
	registerEngineSystem(addr, name, filepath.Join(dir, "admin-tls"), !engineTLS)
	cfg := fmt.Sprintf("name: %s\nrank: 0\nfault_domain: /host0\ncontrol_port: %d\ndata_port: %d\ntargets: 2\nhugepages: false\n"+
		"scm: {class: ram, size: 256MiB}\nbdev: {class: file, path: %s, size: 256MiB}\nmgmt_svc_replicas: [%q]\n"+
		"log_level: info\nlog_file: %s\n%s", name, cp, dp, device, addr, filepath.Join(dir, "engine.log"), tlsLine)
	cfgPath := filepath.Join(dir, "engine.yaml")
	Expect(os.WriteFile(cfgPath, []byte(cfg), 0o644)).To(Succeed())
	out, err := os.Create(filepath.Join(dir, "engine.out"))
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(engineBin, "--config", cfgPath)
	cmd.Stdout, cmd.Stderr = out, out
	e := launch(&engineProcess{name: name, addr: addr, dir: dir, cmd: cmd})
	Expect(out.Close()).To(Succeed()) // the child holds its own descriptor
	waitForRank(addr, 0, dir)
	return e
}

// launch starts e's command and registers it for stopAllEngines.
func launch(e *engineProcess) *engineProcess {
	Expect(e.cmd.Start()).To(Succeed())
	enginesMu.Lock()
	engines = append(engines, e)
	enginesMu.Unlock()
	return e
}

// waitForRank waits until the management service at msAddr lists rank as a member (in any
// state: a blank engine joins in maintenance).
func waitForRank(msAddr string, rank uint32, dir string) {
	ms := msClient(msAddr)
	Eventually(func() ([]uint32, error) {
		r, err := ms.SystemQuery(context.Background(), &mgmtpb.SystemQueryReq{})
		if err != nil {
			return nil, err
		}
		var ranks []uint32
		for _, m := range r.Members {
			ranks = append(ranks, m.Rank)
		}
		return ranks, nil
	}, 60*time.Second, 100*time.Millisecond).Should(ContainElement(rank), "rank %d did not join %s; see %s", rank, msAddr, dir)
}

// podIP is the stand-in IP of a simulated engine pod: every ordinal gets its own loopback
// address, so that all ranks use the ServerSet's one control and data port, as pods do.
func podIP(ordinal int) string { return fmt.Sprintf("127.0.0.%d", ordinal+1) }

// startEnginePod runs ordinal `ordinal` of the ServerSet's StatefulSet the way its pod would:
// the container's command, the start script and the engine configuration from the operator's
// ConfigMap, and the container's environment, with the field references filled in as the kubelet
// would. What a node provides has stand-ins: the pod IP is podIP(ordinal); the config volume
// (/etc/peregrine) and the device volume are directories of the test (EMULATED_NVME_DIR names the
// latter); the image's PATH is the engine binary's directory; and the headless Service's names of
// the other ranks resolve to their pod IPs. It returns when the engine has joined the management
// service at msAddr.
func startEnginePod(sts *appsv1.StatefulSet, cm *corev1.ConfigMap, ordinal int, msAddr string) *engineProcess {
	podName := fmt.Sprintf("%s-%d", sts.Name, ordinal)
	dir := filepath.Join(workDir, podName)
	etc := filepath.Join(dir, "etc")
	Expect(os.MkdirAll(etc, 0o755)).To(Succeed())

	// The device volume: a host directory shared by the ranks of one node; here, of the test.
	devices := filepath.Join(workDir, sts.Name+"-devices")
	Expect(os.MkdirAll(devices, 0o755)).To(Succeed())
	cfg := parseEngineConfig(cm.Data[engineConfigKey])
	// The certificate volume: this rank's Secret, as the kubelet projects it (RANK/ca.crt, ...).
	adminDir := filepath.Join(dir, "admin-tls")
	if cfg.TLSDir != "" {
		Expect(cfg.TLSDir).To(Equal(tlsMountPath))
		// What the init container leaves in the in-memory volume: this rank's Secret.
		Expect(sts.Spec.Template.Spec.InitContainers).To(HaveLen(1))
		tlsDir := filepath.Join(dir, "tls")
		sec := &corev1.Secret{}
		Eventually(func() []byte {
			Expect(client.IgnoreNotFound(k8s.Get(ctx, client.ObjectKey{Namespace: sts.Namespace, Name: sts.Name + "-engine-tls"}, sec))).To(Succeed())
			return sec.Data[fmt.Sprintf("%d.key", ordinal)]
		}, 20*time.Second).ShouldNot(BeEmpty())
		Expect(os.MkdirAll(tlsDir, 0o700)).To(Succeed())
		for dst, src := range map[string]string{pki.CAFile: pki.CAFile, pki.CertFile: fmt.Sprintf("%d.crt", ordinal), pki.KeyFile: fmt.Sprintf("%d.key", ordinal)} {
			Expect(os.WriteFile(filepath.Join(tlsDir, dst), sec.Data[src], 0o600)).To(Succeed())
		}
		cfg.TLSDir = tlsDir
		writeTLSDir(adminDir, testCA(sts.Name), pki.Identity{System: sts.Name, Role: pki.RoleAdmin, Name: "test"})
	}
	registerEngineSystem(msAddr, sts.Name, adminDir, cfg.AllowInsecure)
	// Cluster DNS: the other ranks' names behind the headless Service. The pod's own name stays:
	// the engine knows it (--dns-name) and so finds itself in the list.
	peer := regexp.MustCompile(`^` + regexp.QuoteMeta(sts.Name) + `-(\d+)\.` + regexp.QuoteMeta(sts.Spec.ServiceName+"."+sts.Namespace+".svc") + `:(\d+)$`)
	for i, r := range cfg.MgmtSvcReplicas {
		m := peer.FindStringSubmatch(r)
		Expect(m).NotTo(BeNil(), "replica %q is not a pod of %s", r, sts.Name)
		if k, _ := strconv.Atoi(m[1]); k != ordinal {
			cfg.MgmtSvcReplicas[i] = podIP(k) + ":" + m[2]
		}
	}
	text, err := cfg.marshal()
	Expect(err).NotTo(HaveOccurred())
	Expect(os.WriteFile(filepath.Join(etc, engineConfigKey), []byte(text), 0o644)).To(Succeed())
	script := strings.ReplaceAll(cm.Data[startScriptKey], configMountPath+"/", etc+"/")
	Expect(os.WriteFile(filepath.Join(etc, startScriptKey), []byte(script), 0o755)).To(Succeed())

	c := sts.Spec.Template.Spec.Containers[0]
	Expect(c.Command).To(Equal([]string{"/bin/sh", configMountPath + "/" + startScriptKey}))
	env := []string{"PATH=" + filepath.Dir(engineBin) + ":/usr/bin:/bin"}
	for _, v := range c.Env {
		val := v.Value
		if v.Name == "EMULATED_NVME_DIR" {
			Expect(val).To(Equal(deviceMountPath))
			val = devices
		}
		if v.ValueFrom != nil {
			Expect(v.ValueFrom.FieldRef).NotTo(BeNil(), "env %s", v.Name)
			switch v.ValueFrom.FieldRef.FieldPath {
			case "metadata.name":
				val = podName
			case "metadata.namespace":
				val = sts.Namespace
			case "status.podIP":
				val = podIP(ordinal)
			case "spec.nodeName":
				val = fmt.Sprintf("node%d", ordinal)
			default:
				Fail("env " + v.Name + ": field " + v.ValueFrom.FieldRef.FieldPath + " has no stand-in")
			}
		}
		env = append(env, v.Name+"="+val)
	}
	out, err := os.Create(filepath.Join(dir, "engine.out"))
	Expect(err).NotTo(HaveOccurred())
	cmd := exec.Command(c.Command[0], filepath.Join(etc, startScriptKey))
	cmd.Env, cmd.Stdout, cmd.Stderr = env, out, out
	var port int32
	for _, p := range c.Ports {
		if p.Name == "control" {
			port = p.ContainerPort
		}
	}
	e := launch(&engineProcess{name: podName, addr: fmt.Sprintf("%s:%d", podIP(ordinal), port), dir: dir, cmd: cmd})
	Expect(out.Close()).To(Succeed())
	waitForRank(msAddr, uint32(ordinal), dir)
	return e
}

var testMS = &ManagementServices{CallTimeout: 30 * time.Second}

var (
	systemsMu sync.Mutex
	// engineSystems: the ServerSet (= system) name of the engines at each management address;
	// adminDirs: an administrator's certificate directory for it (the CLI's --tls-dir).
	// insecureAddrs: engines there serve without TLS (allow_insecure).
	engineSystems = map[string]string{}
	adminDirs     = map[string]string{}
	insecureAddrs = map[string]bool{}
)

func registerEngineSystem(addr, system, adminDir string, insecure bool) {
	systemsMu.Lock()
	defer systemsMu.Unlock()
	engineSystems[addr], adminDirs[addr], insecureAddrs[addr] = system, adminDir, insecure
}

// msClient is a client of the management service at addr with the operator's certificate of its
// ServerSet's CA, as the reconcilers have.
func msClient(addr string) mgmtpb.MgmtClient {
	systemsMu.Lock()
	system, insecure := engineSystems[addr], insecureAddrs[addr]
	systemsMu.Unlock()
	Expect(system).NotTo(BeEmpty(), "no engine system registered at %s", addr)
	if testMS.Certs == nil {
		testMS.Certs = &AdminCerts{Reader: k8s}
	}
	c, err := testMS.Client(mgmtTarget{Addr: addr, ServerSet: types.NamespacedName{Namespace: "default", Name: system}, System: system,
		Insecure: insecure})
	Expect(err).NotTo(HaveOccurred())
	return c
}

// testCA is the CA of ServerSet name in namespace default: the operator's when it made one,
// else one made here and stored as the operator would (which it then adopts).
func testCA(name string) *pki.CA {
	sec := &corev1.Secret{}
	err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-ca"}, sec)
	if err == nil {
		ca, err := parseCASecret(sec)
		Expect(err).NotTo(HaveOccurred())
		return ca.signer
	}
	Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%v", err)
	ca, err := pki.NewCA(name, time.Now(), 48*time.Hour)
	Expect(err).NotTo(HaveOccurred())
	keyPEM, err := ca.KeyPEM()
	Expect(err).NotTo(HaveOccurred())
	Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-ca", Namespace: "default"},
		Data: map[string][]byte{pki.CAFile: ca.CertPEM(), pki.CAKeyFile: keyPEM}})).To(Succeed())
	return ca
}

// writeTLSDir writes ca.crt, tls.crt and tls.key of a certificate of ca for id into dir.
func writeTLSDir(dir string, ca *pki.CA, id pki.Identity) {
	leaf, err := ca.Issue(id, time.Now(), 24*time.Hour)
	Expect(err).NotTo(HaveOccurred())
	Expect(os.MkdirAll(dir, 0o700)).To(Succeed())
	for f, b := range map[string][]byte{pki.CAFile: ca.CertPEM(), pki.CertFile: leaf.CertPEM, pki.KeyFile: leaf.KeyPEM} {
		Expect(os.WriteFile(filepath.Join(dir, f), b, 0o600)).To(Succeed())
	}
}

// stop kills the engine, as a crashed or powered-off node would leave it.
func (e *engineProcess) stop() {
	Expect(e.cmd.Process.Kill()).To(Succeed())
	_, _ = e.cmd.Process.Wait()
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
