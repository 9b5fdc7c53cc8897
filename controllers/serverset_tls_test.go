package controllers

import (
	"crypto/x509"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

func getSecret(ns, name string) func() (*corev1.Secret, error) {
	return func() (*corev1.Secret, error) {
		s := &corev1.Secret{}
		err := k8s.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, s)
		return s, err
	}
}

// caOf parses the CA Secret of ServerSet name.
func caOf(name string) *caState {
	sec, err := getSecret("default", name+"-ca")()
	Expect(err).NotTo(HaveOccurred())
	ca, err := parseCASecret(sec)
	Expect(err).NotTo(HaveOccurred())
	return ca
}

// leafOK checks a leaf Secret against the CA Secret's signer and bundle.
func leafOK(ns, secret string, id pki.Identity) func() error {
	return func() error {
		sec, err := getSecret(ns, secret)()
		if err != nil {
			return err
		}
		caSec, err := getSecret("default", id.System+"-ca")()
		if err != nil {
			return err
		}
		ca, err := parseCASecret(caSec)
		if err != nil {
			return err
		}
		if p, d := pki.CheckLeaf(sec.Data[pki.CertFile], sec.Data[pki.KeyFile], ca.signer.Cert, id, time.Now()); p != pki.LeafOK {
			return fmt.Errorf("%s: %s: %s", secret, p, d)
		}
		if string(sec.Data[pki.CAFile]) != string(ca.bundlePEM()) {
			return fmt.Errorf("%s: ca.crt is not the CA Secret's bundle", secret)
		}
		if sec.Type != corev1.SecretTypeTLS {
			return fmt.Errorf("%s: type %s", secret, sec.Type)
		}
		return nil
	}
}

var _ = Describe("CA rotation decisions", func() {
	It("trusts a new CA everywhere before it signs, and drops the old one last", func() {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		year := 365 * 24 * time.Hour
		old, err := pki.NewCA("tank", t0, 3*year)
		Expect(err).NotTo(HaveOccurred())
		s := &caState{bundle: []*x509.Certificate{old.Cert}, signer: old, generation: 4, stageSince: t0}
		dwell := 3 * time.Minute

		Expect(nextCAStep(s, t0.Add(year), true, dwell)).To(Equal(caKeep), "a third in")
		due := t0.Add(2*year + time.Hour)
		Expect(nextCAStep(s, due, false, dwell)).To(Equal(caTrustNew), "two thirds in, whatever the pods")
		h0 := s.hash()
		Expect(applyCAStep(s, caTrustNew, "tank", due, 3*year)).To(Succeed())
		Expect(s.bundle).To(HaveLen(2))
		Expect(s.signer.Cert.Equal(old.Cert)).To(BeTrue(), "the old CA still signs")
		Expect(s.next).NotTo(BeNil())
		Expect(s.hash()).NotTo(Equal(h0), "the pods restart to trust the new CA")
		Expect(s.rotationStage()).To(ContainSubstring("stage 1/3"))

		Expect(nextCAStep(s, due.Add(time.Hour), false, dwell)).To(Equal(caKeep), "engines not restarted yet")
		Expect(nextCAStep(s, due.Add(time.Minute), true, dwell)).To(Equal(caKeep), "dwell not over")
		Expect(nextCAStep(s, due.Add(time.Hour), true, dwell)).To(Equal(caSignNew))
		t2 := due.Add(time.Hour)
		Expect(applyCAStep(s, caSignNew, "tank", t2, 3*year)).To(Succeed())
		Expect(s.signer.Cert.Equal(old.Cert)).To(BeFalse(), "the new CA signs")
		Expect(s.generation).To(Equal(int64(5)), "every leaf is reissued")
		Expect(s.bundle).To(HaveLen(2), "the old CA is still trusted")
		Expect(s.rotationStage()).To(ContainSubstring("stage 2/3"))

		Expect(nextCAStep(s, t2.Add(time.Hour), false, dwell)).To(Equal(caKeep))
		Expect(nextCAStep(s, t2.Add(time.Hour), true, dwell)).To(Equal(caDropOld))
		Expect(applyCAStep(s, caDropOld, "tank", t2.Add(time.Hour), 3*year)).To(Succeed())
		Expect(s.bundle).To(HaveLen(1))
		Expect(s.bundle[0].Equal(s.signer.Cert)).To(BeTrue())
		Expect(s.rotationStage()).To(BeEmpty())
		Expect(nextCAStep(s, t2.Add(2*time.Hour), true, dwell)).To(Equal(caKeep))
	})

	It("drops an expired CA from the bundle but never the signer", func() {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		a, _ := pki.NewCA("tank", t0, time.Hour)
		b, _ := pki.NewCA("tank", t0, 24*time.Hour)
		s := &caState{bundle: []*x509.Certificate{a.Cert, b.Cert}, signer: b}
		Expect(s.pruneExpired(t0.Add(30 * time.Minute))).To(BeFalse())
		Expect(s.pruneExpired(t0.Add(2 * time.Hour))).To(BeTrue())
		Expect(s.bundle).To(HaveLen(1))
		Expect(s.bundle[0].Equal(b.Cert)).To(BeTrue())
	})
})

var _ = Describe("The engine pod's certificate init script", func() {
	It("copies the pod's own rank's certificate, and only it, read-only, again at a restart, without capabilities", func() {
		root := GinkgoT().TempDir()
		ranks, own := filepath.Join(root, "ranks"), filepath.Join(root, "tls")
		Expect(os.MkdirAll(ranks, 0o700)).To(Succeed())
		files := map[string]string{"ca.crt": "bundle", "0.crt": "c0", "0.key": "k0", "12.crt": "c12", "12.key": "k12"}
		for f, b := range files {
			Expect(os.WriteFile(filepath.Join(ranks, f), []byte(b), 0o400)).To(Succeed())
		}
		Expect(os.MkdirAll(own, 0o700)).To(Succeed())
		script := strings.NewReplacer(tlsRanksMountPath, ranks, tlsMountPath, own).Replace(tlsInitScript)
		// As the init container runs it: without capabilities (root without CAP_DAC_OVERRIDE
		// cannot write over a 0400 file). The second run is the pod's sandbox re-created after a
		// node restart: the volume still holds the first run's copies.
		argv := []string{"/bin/sh", "-c", script}
		if os.Geteuid() == 0 {
			setpriv, err := exec.LookPath("setpriv")
			Expect(err).NotTo(HaveOccurred(), "setpriv (util-linux) drops root's capabilities for the script")
			argv = append([]string{setpriv, "--bounding-set=-all", "--inh-caps=-all"}, argv...)
		}
		for run := 1; run <= 2; run++ {
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = []string{"POD_NAME=tank-web-12"}
			out, err := cmd.CombinedOutput()
			Expect(err).NotTo(HaveOccurred(), "run %d: %s", run, out)
		}
		entries, err := os.ReadDir(own)
		Expect(err).NotTo(HaveOccurred())
		Expect(entries).To(HaveLen(3))
		for f, want := range map[string]string{"ca.crt": "bundle", "tls.crt": "c12", "tls.key": "k12"} {
			b, err := os.ReadFile(filepath.Join(own, f))
			Expect(err).NotTo(HaveOccurred())
			Expect(string(b)).To(Equal(want))
			st, err := os.Stat(filepath.Join(own, f))
			Expect(err).NotTo(HaveOccurred())
			Expect(st.Mode().Perm()).To(Equal(os.FileMode(0o400)))
		}
	})
})

var _ = Describe("ServerSet control-plane TLS", func() {
	It("makes a CA and one certificate per rank, mounts them in the engine pods, and replaces forged or expired ones", func() {
		const name = "tls"
		key := client.ObjectKey{Namespace: "default", Name: name}
		Expect(k8s.Create(ctx, tlsServerSet(name, 2))).To(Succeed())

		By("the CA Secret, owned by the ServerSet")
		Eventually(getSecret("default", name+"-ca"), 20*time.Second).Should(And(
			HaveField("Type", corev1.SecretTypeOpaque),
			HaveField("OwnerReferences", ContainElement(HaveField("Name", name))),
			HaveField("Data", And(HaveKey("ca.crt"), HaveKey("ca.key")))))
		ca := caOf(name)
		Expect(ca.bundle).To(HaveLen(1))
		Expect(ca.signer.Cert.IsCA).To(BeTrue())

		By("one kubernetes.io/tls Secret per rank, for peregrine://tls/engine/RANK")
		for r := int32(0); r < 2; r++ {
			Eventually(leafOK("default", engineTLSSecretName(&storagev1.ServerSet{ObjectMeta: metav1.ObjectMeta{Name: name}}, r),
				pki.EngineIdentity(name, r)), 20*time.Second).Should(Succeed())
		}
		sec, _ := getSecret("default", name+"-1-tls")()
		Expect(sec.OwnerReferences).To(ContainElement(HaveField("Name", name)))

		By("the engine pods mount them: the init container every rank's, the engine its own rank's copy")
		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, key, sts) }, 20*time.Second).Should(Succeed())
		spec := sts.Spec.Template.Spec
		vols := map[string]corev1.Volume{}
		for _, v := range spec.Volumes {
			vols[v.Name] = v
		}
		Expect(vols).To(HaveKey("tls-ranks"))
		Expect(vols["tls-ranks"].Secret.SecretName).To(Equal(name + "-engine-tls"))
		Eventually(func() error {
			b, err := getSecret("default", name+"-engine-tls")()
			if err != nil {
				return err
			}
			for r := 0; r < 2; r++ {
				rs, err := getSecret("default", fmt.Sprintf("%s-%d-tls", name, r))()
				if err != nil {
					return err
				}
				if string(b.Data[fmt.Sprintf("%d.crt", r)]) != string(rs.Data["tls.crt"]) || string(b.Data[fmt.Sprintf("%d.key", r)]) != string(rs.Data["tls.key"]) {
					return fmt.Errorf("rank %d differs between %s-engine-tls and %s", r, name, rs.Name)
				}
			}
			if string(b.Data["ca.crt"]) != string(caOf(name).bundlePEM()) {
				return fmt.Errorf("ca.crt of %s-engine-tls is not the bundle", name)
			}
			return nil
		}, 20*time.Second).Should(Succeed())
		Expect(vols).To(HaveKey("tls"))
		Expect(vols["tls"].EmptyDir).NotTo(BeNil())
		Expect(vols["tls"].EmptyDir.Medium).To(Equal(corev1.StorageMediumMemory))
		Expect(spec.InitContainers).To(HaveLen(1))
		Expect(spec.InitContainers[0].VolumeMounts).To(ConsistOf(
			corev1.VolumeMount{Name: "tls-ranks", MountPath: tlsRanksMountPath, ReadOnly: true},
			corev1.VolumeMount{Name: "tls", MountPath: tlsMountPath}))
		Expect(spec.Containers[0].VolumeMounts).To(ContainElement(corev1.VolumeMount{Name: "tls", MountPath: tlsMountPath, ReadOnly: true}))
		for _, m := range spec.Containers[0].VolumeMounts {
			Expect(m.Name).NotTo(Equal("tls-ranks"), "the engine container must not see other ranks' keys")
		}
		Expect(sts.Spec.Template.Annotations).To(HaveKeyWithValue(tlsHashKey, ca.hash()))
		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-config"}, cm)).To(Succeed())
		cfg := parseEngineConfig(cm.Data[engineConfigKey])
		Expect(cfg.TLSDir).To(Equal("/etc/peregrine-tls"))
		Expect(cfg.AllowInsecure).To(BeFalse())
		Expect(cm.Data[engineConfigKey]).NotTo(ContainSubstring("allow_insecure"))
		Eventually(func() metav1.Condition {
			return condition(getServerSet(name)().Status.Conditions, storagev1.ConditionControlPlaneTLS)
		}, 20*time.Second).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", string(storagev1.ReasonCertificatesReady))))

		By("a forged certificate (another CA, the right name) is replaced")
		rogue, err := pki.NewCA(name, time.Now(), time.Hour)
		Expect(err).NotTo(HaveOccurred())
		forged, err := rogue.Issue(pki.EngineIdentity(name, 1), time.Now(), time.Hour)
		Expect(err).NotTo(HaveOccurred())
		sec, _ = getSecret("default", name+"-1-tls")()
		sec.Data[pki.CertFile], sec.Data[pki.KeyFile] = forged.CertPEM, forged.KeyPEM
		Expect(k8s.Update(ctx, sec)).To(Succeed())
		Eventually(leafOK("default", name+"-1-tls", pki.EngineIdentity(name, 1)), 20*time.Second).Should(Succeed())
		Eventually(func() []string { return eventReasons(name) }, 20*time.Second).Should(ContainElement("CertificateReplaced"))

		// A single replacement keeps the generation: the engines are not restarted for it.
		Expect(caOf(name).hash()).To(Equal(ca.hash()))

		By("an expired certificate of the right CA renews every certificate (one restart of the engines)")
		caKey, err := caOf(name).signer.KeyPEM()
		Expect(err).NotTo(HaveOccurred())
		signer, err := pki.ParseCA(pki.EncodeCerts(caOf(name).signer.Cert), caKey)
		Expect(err).NotTo(HaveOccurred())
		expired, err := signer.Issue(pki.EngineIdentity(name, 0), time.Now().Add(-2*time.Hour), time.Hour)
		Expect(err).NotTo(HaveOccurred())
		sec, _ = getSecret("default", name+"-0-tls")()
		sec.Data[pki.CertFile], sec.Data[pki.KeyFile] = expired.CertPEM, expired.KeyPEM
		Expect(k8s.Update(ctx, sec)).To(Succeed())
		Eventually(leafOK("default", name+"-0-tls", pki.EngineIdentity(name, 0)), 20*time.Second).Should(Succeed())
		Expect(caOf(name).generation).To(Equal(ca.generation + 1))
		Eventually(leafOK("default", name+"-1-tls", pki.EngineIdentity(name, 1)), 20*time.Second).Should(Succeed())
		Eventually(func() map[string]string {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return sts.Spec.Template.Annotations
		}, 20*time.Second).Should(HaveKeyWithValue(tlsHashKey, caOf(name).hash()))
		Expect(eventReasons(name)).To(ContainElement("CertificatesRenewed"))

		By("a certificate of another rank put in rank 0's Secret is replaced")
		renewed := caOf(name)
		other, _ := getSecret("default", name+"-1-tls")()
		sec, _ = getSecret("default", name+"-0-tls")()
		sec.Data = other.Data
		Expect(k8s.Update(ctx, sec)).To(Succeed())
		Eventually(leafOK("default", name+"-0-tls", pki.EngineIdentity(name, 0)), 20*time.Second).Should(Succeed())
		Expect(caOf(name).hash()).To(Equal(renewed.hash()))
	})

	It("issues the CSI driver's certificates in its namespace for the ServerSet it serves", func() {
		Expect(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: testTLSOptions.CSINamespace}})).To(Succeed())
		Expect(k8s.Create(ctx, tlsServerSet("csi-tls", 1))).To(Succeed())
		Eventually(leafOK(testTLSOptions.CSINamespace, CSIControllerSecret, pki.Identity{System: "csi-tls", Role: pki.RoleAdmin, Name: "csi-controller"}),
			20*time.Second).Should(Succeed())
		Eventually(leafOK(testTLSOptions.CSINamespace, CSINodeSecret, pki.Identity{System: "csi-tls", Role: pki.RoleClient, Name: "csi-node"}),
			20*time.Second).Should(Succeed())
		sec, _ := getSecret(testTLSOptions.CSINamespace, CSINodeSecret)()
		Expect(sec.OwnerReferences).To(BeEmpty(), "no owner references across namespaces")
		_, err := getSecret(testTLSOptions.CSINamespace, CSINodeAdminSecret)()
		Expect(err).To(HaveOccurred(), "no admin certificate for the node plugin unless --csi-node-role=admin")
	})

	It("rotates a CA two thirds into its life: trusted everywhere, then signing, then the old one dropped", func() {
		const name = "rotate"
		key := client.ObjectKey{Namespace: "default", Name: name}
		By("a CA Secret made beforehand (a CA brought by the user is kept), 80% into its validity")
		old, err := pki.NewCA(name, time.Now().Add(-80*time.Hour), 100*time.Hour)
		Expect(err).NotTo(HaveOccurred())
		keyPEM, err := old.KeyPEM()
		Expect(err).NotTo(HaveOccurred())
		Expect(k8s.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name + "-ca", Namespace: "default"},
			Data: map[string][]byte{pki.CAFile: old.CertPEM(), pki.CAKeyFile: keyPEM}})).To(Succeed())
		Expect(k8s.Create(ctx, tlsServerSet(name, 1))).To(Succeed())

		By("stage 1: the new CA is trusted by the engine's Secret, the old one still signs")
		Eventually(func() int { return len(caOf(name).bundle) }, 20*time.Second).Should(Equal(2))
		ca := caOf(name)
		Expect(ca.signer.Cert.Equal(old.Cert)).To(BeTrue())
		Eventually(func() ([]byte, error) {
			s, err := getSecret("default", name+"-0-tls")()
			return s.Data[pki.CAFile], err
		}, 20*time.Second).Should(Equal(ca.bundlePEM()))
		Eventually(func() string {
			return condition(getServerSet(name)().Status.Conditions, storagev1.ConditionControlPlaneTLS).Reason
		}, 20*time.Second).Should(Equal(string(storagev1.ReasonCARotating)))
		Consistently(func() bool { return caOf(name).next != nil }, 3*time.Second).Should(BeTrue(), "no step before the engines restarted")

		By("stage 2: once the engine restarted, the new CA signs a new certificate")
		// Marked only while the step has not come: a mark after it would let the next step run too.
		Eventually(func() bool {
			if caOf(name).next == nil {
				return true
			}
			markRolled(key)
			return false
		}, 30*time.Second, time.Second).Should(BeTrue())
		ca = caOf(name)
		Expect(ca.signer.Cert.Equal(old.Cert)).To(BeFalse())
		Expect(ca.bundle).To(HaveLen(2))
		Eventually(leafOK("default", name+"-0-tls", pki.EngineIdentity(name, 0)), 20*time.Second).Should(Succeed())

		By("stage 3: once it restarted again, the old CA is dropped")
		Eventually(func() int {
			n := len(caOf(name).bundle)
			if n > 1 {
				markRolled(key)
			}
			return n
		}, 30*time.Second, time.Second).Should(Equal(1))
		Eventually(leafOK("default", name+"-0-tls", pki.EngineIdentity(name, 0)), 20*time.Second).Should(Succeed())
		Eventually(func() string {
			return condition(getServerSet(name)().Status.Conditions, storagev1.ConditionControlPlaneTLS).Reason
		}, 20*time.Second).Should(Equal(string(storagev1.ReasonCertificatesReady)))
		Expect(eventReasons(name)).To(ContainElement("CARotating"))
	})

	It("runs an insecure ServerSet's engine with allow_insecure, and talks to it without TLS, saying so", func() {
		const name = "plain-engine"
		key := client.ObjectKey{Namespace: "default", Name: name}
		cp, dp := freePort(), freePort()
		msAddr := fmt.Sprintf("%s:%d", podIP(0), cp)
		ss := newServerSet(name, msAddr, 1)
		ss.Spec.InsecureControlPlane = true
		ss.Spec.ControlPort, ss.Spec.DataPort, ss.Spec.MetricsPort = int32(cp), int32(dp), int32(freePort())
		ss.Spec.Storage.Emulated.Size = "256MiB"
		Expect(k8s.Create(ctx, ss)).To(Succeed())
		sts, cm := &appsv1.StatefulSet{}, &corev1.ConfigMap{}
		Eventually(func() error { return k8s.Get(ctx, key, sts) }, 20*time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-config"}, cm)).To(Succeed())
		Expect(parseEngineConfig(cm.Data[engineConfigKey]).AllowInsecure).To(BeTrue())
		Expect(sts.Spec.Template.Spec.InitContainers).To(BeEmpty())
		startEnginePod(sts, cm, 0, msAddr)
		markPodsReady(key, 1)
		Eventually(func() int32 { return getServerSet(name)().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(1)))
		c := condition(getServerSet(name)().Status.Conditions, storagev1.ConditionControlPlaneTLS)
		Expect(c.Status).To(Equal(metav1.ConditionFalse))
		Expect(c.Reason).To(Equal(string(storagev1.ReasonInsecureControlPlane)))
		Eventually(func() []string { return eventReasons(name) }, 20*time.Second).Should(ContainElement("InsecureControlPlane"))
		_, err := getSecret("default", name+"-ca")()
		Expect(err).To(HaveOccurred(), "no CA for an insecure ServerSet")
	})

	It("refuses an insecure control plane unless the operator allows it", func() {
		ss := newServerSet("plain", "127.0.0.1:1", 1)
		ss.Spec.InsecureControlPlane = true
		deny := DefaultEnginePolicy()
		deny.AllowedImages = append(deny.AllowedImages, "peregrine:")
		errs := deny.Check(ss)
		Expect(errs).To(HaveLen(1))
		Expect(errs[0].Error()).To(ContainSubstring("spec.insecureControlPlane: Forbidden"))
		allow := deny
		allow.AllowInsecureControlPlane = true
		Expect(allow.Check(ss)).To(BeEmpty())

		By("rendered for an operator that allows it: allow_insecure, no certificate volume")
		cm, err := renderConfigMap(ss)
		Expect(err).NotTo(HaveOccurred())
		Expect(cm.Data[engineConfigKey]).To(ContainSubstring("allow_insecure: true\n"))
		Expect(cm.Data[engineConfigKey]).NotTo(ContainSubstring("tls_dir"))
		sts := renderStatefulSet(ss, 1, 0, "h", "")
		for _, v := range sts.Spec.Template.Spec.Volumes {
			Expect(v.Name).NotTo(HavePrefix("tls"))
		}
		Expect(sts.Spec.Template.Spec.InitContainers).To(BeEmpty())
	})
})

// markRolled reports the StatefulSet's pods as running its current template, as the StatefulSet
// controller and kubelets would once they restarted.
func markRolled(key client.ObjectKey) {
	updateStatefulSetStatus(key, func(sts *appsv1.StatefulSet) {
		n := ptr.Deref(sts.Spec.Replicas, 1)
		sts.Status.ObservedGeneration = sts.Generation
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.AvailableReplicas = n, n, n
		sts.Status.CurrentReplicas, sts.Status.UpdatedReplicas = n, n
	})
}

func eventReasons(name string) []string {
	var out []string
	for _, e := range serverSetEvents(name) {
		out = append(out, e.Reason)
	}
	return out
}

// tlsServerSet is a ServerSet with TLS whatever the engine binary (these specs run no engine).
func tlsServerSet(name string, engines int32) *storagev1.ServerSet {
	ss := newServerSet(name, "127.0.0.1:1", engines)
	ss.Spec.InsecureControlPlane = false
	return ss
}
