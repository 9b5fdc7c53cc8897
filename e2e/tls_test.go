package e2e

// The control plane's mutual TLS (issue 20, point 1): the operator keeps a CA per ServerSet and a
// certificate per rank, the engines serve their gRPC API only to holders of a certificate of that
// CA, the CSI driver holds its own (the PVC specs of this suite mount volumes through it). The
// CLI runs in one-shot pods of the engine image, as an administrator would run it, with the
// certificates it is given (none, a forged one, one of the ServerSet's CA).

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// Secrets of this suite's namespace that the CLI pods mount.
const (
	adminTLSSecret = "e2e-admin-tls"
	rogueTLSSecret = "e2e-rogue-tls"
	caOnlySecret   = "e2e-ca-only"
)

// insecureCLI runs the CLI ("$@") against a store without TLS: with --insecure when the CLI has
// the flag (it then requires it), as is when it predates TLS.
const insecureCLI = `if peregrine --help 2>&1 | grep -q -- --insecure; then exec peregrine --insecure "$@"; fi; exec peregrine "$@"`

// storeInsecure reports whether the store's ServerSet runs without TLS (spec.insecureControlPlane:
// hack/demo.sh sets it, with a warning, when the engines built predate TLS).
func storeInsecure(ctx context.Context) bool {
	ss := &storagev1.ServerSet{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, ss)).To(Succeed())
	return ss.Spec.InsecureControlPlane
}

// storeMgmt is the store's management service as pods reach it.
func storeMgmt() string { return fmt.Sprintf("%s-0.%s.%s.svc:10001", storeName, storeName, storeNS) }

// storeCA reads the ServerSet's CA (its signing certificate and key, and the trust bundle).
func storeCA(ctx context.Context) (*pki.CA, []byte) {
	sec := &corev1.Secret{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName + "-ca"}, sec)).To(Succeed())
	bundle, err := pki.ParseCerts(sec.Data[pki.CAFile])
	Expect(err).NotTo(HaveOccurred())
	key, err := pki.ParseKey(sec.Data[pki.CAKeyFile])
	Expect(err).NotTo(HaveOccurred())
	ca, err := pki.Signer(bundle, key)
	Expect(err).NotTo(HaveOccurred())
	return ca, sec.Data[pki.CAFile]
}

// putSecret creates or replaces a Secret of this suite's namespace.
func putSecret(ctx context.Context, name string, data map[string][]byte) {
	sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Data: data}
	if err := k8s.Create(ctx, sec); apierrors.IsAlreadyExists(err) {
		Expect(k8s.Update(ctx, sec)).To(Succeed())
	} else {
		Expect(err).NotTo(HaveOccurred())
	}
}

// ensureAdminSecret gives this suite an administrator's certificate of the store's system, as an
// operator of the cluster would issue one from the CA Secret (docs/tls.md).
func ensureAdminSecret(ctx context.Context) {
	ca, bundle := storeCA(ctx)
	leaf, err := ca.Issue(pki.Identity{System: storeName, Role: pki.RoleAdmin, Name: "e2e"}, time.Now(), 2*time.Hour)
	Expect(err).NotTo(HaveOccurred())
	putSecret(ctx, adminTLSSecret, map[string][]byte{pki.CAFile: bundle, pki.CertFile: leaf.CertPEM, pki.KeyFile: leaf.KeyPEM})
}

// tlsVolume mounts Secret name at /tls.
func tlsVolume(name string) ([]corev1.Volume, []corev1.VolumeMount) {
	return []corev1.Volume{{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: name}}}},
		[]corev1.VolumeMount{{Name: "tls", MountPath: "/tls", ReadOnly: true}}
}

func controlPlaneSpecs(ctx context.Context) {
	It("serves the engines' control plane with mutual TLS only: no certificate, a forged one or plain HTTP/2 are refused", func() {
		if storeInsecure(ctx) {
			Skip("the store's ServerSet runs without TLS (spec.insecureControlPlane: its engines predate TLS); nothing to check")
		}
		By("the ServerSet reports its certificates in place; every engine pod mounts them")
		ss := &storagev1.ServerSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, ss)).To(Succeed())
		c := apimeta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionControlPlaneTLS)
		Expect(c).NotTo(BeNil(), "no ControlPlaneTLS condition")
		Expect(c.Status).To(Equal(metav1.ConditionTrue), "%s: %s", c.Reason, c.Message)
		sts := &appsv1.StatefulSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, sts)).To(Succeed())
		var tlsVol *corev1.Volume
		for i, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == "tls-ranks" {
				tlsVol = &sts.Spec.Template.Spec.Volumes[i]
			}
		}
		Expect(tlsVol).NotTo(BeNil())
		Expect(tlsVol.Secret.SecretName).To(Equal(storeName + "-engine-tls"))
		for r := 0; r < int(ptr.Deref(sts.Spec.Replicas, 0)); r++ {
			sec := &corev1.Secret{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: fmt.Sprintf("%s-%d-tls", storeName, r)}, sec)).To(Succeed())
			Expect(sec.Type).To(Equal(corev1.SecretTypeTLS))
		}
		By("the CSI driver's certificates are in the release's namespace")
		for _, name := range []string{"peregrine-csi-controller-tls", "peregrine-csi-node-tls"} {
			sec := &corev1.Secret{}
			Expect(k8s.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: name}, sec)).To(Succeed(), name)
		}

		By("the CLI with no certificate, a forged one, only the CA, plain HTTP/2, and one of the ServerSet's CA")
		ensureAdminSecret(ctx)
		_, bundle := storeCA(ctx)
		rogue, err := pki.NewCA(storeName, time.Now(), time.Hour)
		Expect(err).NotTo(HaveOccurred())
		forged, err := rogue.Issue(pki.Identity{System: storeName, Role: pki.RoleAdmin, Name: "e2e"}, time.Now(), time.Hour)
		Expect(err).NotTo(HaveOccurred())
		// The forged certificate comes with the real CA bundle: the CLI trusts the engines, the
		// engines must not trust it.
		putSecret(ctx, rogueTLSSecret, map[string][]byte{pki.CAFile: bundle, pki.CertFile: forged.CertPEM, pki.KeyFile: forged.KeyPEM})
		putSecret(ctx, caOnlySecret, map[string][]byte{pki.CAFile: bundle})

		script := `
run() { name=$1; shift; echo "== $name: $*"; if "$@" 2>&1; then echo "== $name rc=0"; else echo "== $name rc=$?"; fi; }
M=` + storeMgmt() + `
run insecure peregrine --mgmt "$M" --timeout 15 --insecure system query
run forged   peregrine --mgmt "$M" --timeout 15 --tls-dir /forged system query
run ca-only  peregrine --mgmt "$M" --timeout 15 --tls-dir /ca-only system query
run admin    peregrine --mgmt "$M" --timeout 15 --tls-dir /admin system query
`
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "tls-cli", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: engineImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"/bin/sh", "-c", script},
					VolumeMounts: []corev1.VolumeMount{
						{Name: "admin", MountPath: "/admin", ReadOnly: true},
						{Name: "forged", MountPath: "/forged", ReadOnly: true},
						{Name: "ca-only", MountPath: "/ca-only", ReadOnly: true},
					},
				}},
				Volumes: []corev1.Volume{
					{Name: "admin", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: adminTLSSecret}}},
					{Name: "forged", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: rogueTLSSecret}}},
					{Name: "ca-only", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: caOnlySecret}}},
				},
			},
		}
		logs := runPodSpec(pod)
		GinkgoWriter.Println(logs)
		rc := map[string]string{}
		for _, m := range regexp.MustCompile(`(?m)^== (\S+) rc=(\d+)$`).FindAllStringSubmatch(logs, -1) {
			rc[m[1]] = m[2]
		}
		Expect(rc).To(HaveKeyWithValue("admin", "0"), "a certificate of the ServerSet's CA must be served:\n%s", logs)
		for _, refused := range []string{"insecure", "forged", "ca-only"} {
			Expect(rc).To(HaveKey(refused), logs)
			Expect(rc[refused]).NotTo(Equal("0"), "%s must be refused:\n%s", refused, logs)
		}
		_, admin, _ := strings.Cut(logs, "== admin: ")
		Expect(admin).To(ContainSubstring("joined"), "the administrator's system query:\n%s", logs)
		Expect(strings.Count(logs, "== ")).To(Equal(8))
	})
}
