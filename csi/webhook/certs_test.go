package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

func testCertOptions(dir string) CertOptions {
	return CertOptions{
		Namespace: "peregrine-system", ServiceName: "peregrine-webhook",
		WebhookConfigName: "peregrine-webhook", CertDir: dir,
	}
}

func fakeClient(t *testing.T) client.Client {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "peregrine-webhook"},
		Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "intercept.peregrine.dev"}},
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(mwc).Build()
}

func getSecret(t *testing.T, c client.Client) *corev1.Secret {
	t.Helper()
	s := &corev1.Secret{}
	if err := c.Get(context.Background(), types.NamespacedName{Namespace: "peregrine-system", Name: DefaultSecretName}, s); err != nil {
		t.Fatal(err)
	}
	return s
}

func getCABundle(t *testing.T, c client.Client) []byte {
	t.Helper()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := c.Get(context.Background(), types.NamespacedName{Name: "peregrine-webhook"}, mwc); err != nil {
		t.Fatal(err)
	}
	return mwc.Webhooks[0].ClientConfig.CABundle
}

// verifyServing checks that certPEM/keyPEM form an ECDSA P-256 server pair for the service's names
// that chains to a CA of bundle, and returns the certificate.
func verifyServing(t *testing.T, certPEM, keyPEM, bundle []byte) *x509.Certificate {
	t.Helper()
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("key pair: %v", err)
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || pub.Curve != elliptic.P256() {
		t.Errorf("key %T, want ECDSA P-256", cert.PublicKey)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle has no certificate")
	}
	for _, name := range []string{"peregrine-webhook.peregrine-system.svc", "peregrine-webhook.peregrine-system.svc.cluster.local"} {
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: name, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			t.Errorf("verify for %s: %v", name, err)
		}
	}
	return cert
}

func TestCertCreateAndKeep(t *testing.T) {
	c := fakeClient(t)
	dir := t.TempDir()
	r, err := NewCertRotator(c, testCertOptions(dir))
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.Ready():
	default:
		t.Error("not ready after a successful check")
	}
	s := getSecret(t, c)
	if s.Type != corev1.SecretTypeTLS {
		t.Errorf("type %s", s.Type)
	}
	cert := verifyServing(t, s.Data["tls.crt"], s.Data["tls.key"], s.Data["ca.crt"])
	if d := time.Until(cert.NotAfter); d < 364*24*time.Hour || d > 366*24*time.Hour {
		t.Errorf("certificate valid for %v, want a year", d)
	}
	cas := parseCerts(s.Data["ca.crt"])
	if len(cas) != 1 || time.Until(cas[0].NotAfter) < 9*365*24*time.Hour {
		t.Errorf("CA bundle %d certificates, first until %v", len(cas), cas[0].NotAfter)
	}
	if !bytes.Equal(getCABundle(t, c), s.Data["ca.crt"]) {
		t.Error("caBundle is not the Secret's ca.crt")
	}
	for _, name := range []string{"tls.crt", "tls.key", "ca.crt"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || !bytes.Equal(b, s.Data[name]) {
			t.Errorf("%s in the cert dir differs from the Secret (%v)", name, err)
		}
	}

	// Nothing due: a second check leaves the Secret alone.
	if err := r.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s2 := getSecret(t, c); s2.ResourceVersion != s.ResourceVersion {
		t.Errorf("Secret rewritten without need")
	}

	// A second replica (another cert dir) takes what the Secret holds.
	dir2 := t.TempDir()
	r2, _ := NewCertRotator(c, testCertOptions(dir2))
	if err := r2.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(filepath.Join(dir2, "tls.crt"))
	if !bytes.Equal(b, s.Data["tls.crt"]) || getSecret(t, c).ResourceVersion != s.ResourceVersion {
		t.Error("second replica did not adopt the Secret")
	}
}

// Rotators racing on an empty cluster all end with the one certificate the Secret holds.
func TestCertReplicasAgree(t *testing.T) {
	c := fakeClient(t)
	dirs := make([]string, 4)
	var wg sync.WaitGroup
	for i := range dirs {
		dirs[i] = t.TempDir()
		r, _ := NewCertRotator(c, testCertOptions(dirs[i]))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.Check(context.Background()); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	s := getSecret(t, c)
	for _, d := range dirs {
		b, _ := os.ReadFile(filepath.Join(d, "tls.crt"))
		if !bytes.Equal(b, s.Data["tls.crt"]) {
			t.Errorf("%s holds another certificate than the Secret", d)
		}
	}
}

// seedSecret overwrites the Secret's data.
func seedSecret(t *testing.T, c client.Client, data map[string][]byte) {
	t.Helper()
	s := getSecret(t, c)
	s.Data = data
	if err := c.Update(context.Background(), s); err != nil {
		t.Fatal(err)
	}
}

func TestCertRenewal(t *testing.T) {
	c := fakeClient(t)
	r, _ := NewCertRotator(c, testCertOptions(t.TempDir()))
	ctx := context.Background()
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	orig := getSecret(t, c).Data
	now := time.Now()
	ca, caKey, _ := parseCA(orig, now)

	// A serving certificate with less than a third of its life left: re-issued by the same CA.
	certPEM, keyPEM, err := newServingCert(ca, caKey, testCertOptions("").DNSNames(), now.Add(-200*24*time.Hour), 230*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	old := map[string][]byte{"ca.crt": orig["ca.crt"], "ca.key": orig["ca.key"], "tls.crt": certPEM, "tls.key": keyPEM}
	seedSecret(t, c, old)
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := getSecret(t, c).Data
	if bytes.Equal(got["tls.crt"], certPEM) {
		t.Fatal("near-expiry certificate kept")
	}
	if !bytes.Equal(got["ca.crt"], orig["ca.crt"]) || !bytes.Equal(getCABundle(t, c), orig["ca.crt"]) {
		t.Error("the CA changed on a serving certificate renewal")
	}
	if cert := verifyServing(t, got["tls.crt"], got["tls.key"], orig["ca.crt"]); time.Until(cert.NotAfter) < 364*24*time.Hour {
		t.Errorf("renewed certificate until %v", cert.NotAfter)
	}

	// Still two thirds left: kept.
	certPEM, keyPEM, _ = newServingCert(ca, caKey, testCertOptions("").DNSNames(), now.Add(-100*24*time.Hour), 365*24*time.Hour)
	seedSecret(t, c, map[string][]byte{"ca.crt": orig["ca.crt"], "ca.key": orig["ca.key"], "tls.crt": certPEM, "tls.key": keyPEM})
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(getSecret(t, c).Data["tls.crt"], certPEM) {
		t.Error("a certificate with more than a third of its life left was replaced")
	}

	// For another service name, or with a key that does not match, or garbage: re-issued.
	other := testCertOptions("")
	other.ServiceName = "elsewhere"
	wrongName, wrongNameKey, _ := newServingCert(ca, caKey, other.DNSNames(), now, 365*24*time.Hour)
	_, strayKey, _ := newServingCert(ca, caKey, testCertOptions("").DNSNames(), now, 365*24*time.Hour)
	for name, pair := range map[string][2][]byte{
		"wrong name": {wrongName, wrongNameKey},
		"wrong key":  {certPEM, strayKey},
		"garbage":    {[]byte("x"), []byte("y")},
		"missing":    {nil, nil},
	} {
		seedSecret(t, c, map[string][]byte{"ca.crt": orig["ca.crt"], "ca.key": orig["ca.key"], "tls.crt": pair[0], "tls.key": pair[1]})
		if err := r.Check(ctx); err != nil {
			t.Fatal(err)
		}
		got := getSecret(t, c).Data
		if bytes.Equal(got["tls.crt"], pair[0]) {
			t.Errorf("%s: kept", name)
		}
		verifyServing(t, got["tls.crt"], got["tls.key"], orig["ca.crt"])
	}
}

func TestCARenewal(t *testing.T) {
	c := fakeClient(t)
	r, _ := NewCertRotator(c, testCertOptions(t.TempDir()))
	ctx := context.Background()
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	// A CA with less than a third of its life left, and a fresh certificate it signed.
	oldCA, oldKey, err := newCA(now.Add(-8*365*24*time.Hour), 10*365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	oldKeyPEM, _ := pemKey(oldKey)
	certPEM, keyPEM, _ := newServingCert(oldCA, oldKey, testCertOptions("").DNSNames(), now, 365*24*time.Hour)
	seedSecret(t, c, map[string][]byte{"ca.crt": pemCert(oldCA.Raw), "ca.key": oldKeyPEM, "tls.crt": certPEM, "tls.key": keyPEM})
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	got := getSecret(t, c).Data
	cas := parseCerts(got["ca.crt"])
	if len(cas) != 2 || cas[0].Equal(oldCA) || !cas[1].Equal(oldCA) {
		t.Fatalf("bundle after CA renewal: %d certificates, want the new CA then the old one", len(cas))
	}
	if !bytes.Equal(getCABundle(t, c), got["ca.crt"]) {
		t.Error("caBundle not updated")
	}
	if bytes.Equal(got["tls.crt"], certPEM) {
		t.Error("serving certificate not re-issued by the new CA")
	}
	newOnly := x509.NewCertPool()
	newOnly.AddCert(cas[0])
	cert := verifyServing(t, got["tls.crt"], got["tls.key"], got["ca.crt"])
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: "peregrine-webhook.peregrine-system.svc", Roots: newOnly}); err != nil {
		t.Errorf("new certificate not signed by the new CA: %v", err)
	}
	// The old certificate (still served by replicas that have not checked yet) stays trusted.
	verifyServing(t, certPEM, keyPEM, got["ca.crt"])

	// An expired CA leaves the bundle.
	expired, expiredKey, _ := newCA(now.Add(-48*time.Hour), 24*time.Hour)
	expiredKeyPEM, _ := pemKey(expiredKey)
	seedSecret(t, c, map[string][]byte{"ca.crt": pemCert(expired.Raw), "ca.key": expiredKeyPEM, "tls.crt": certPEM, "tls.key": keyPEM})
	if err := r.Check(ctx); err != nil {
		t.Fatal(err)
	}
	if cas := parseCerts(getSecret(t, c).Data["ca.crt"]); len(cas) != 1 || cas[0].Equal(expired) {
		t.Errorf("expired CA kept in the bundle (%d certificates)", len(cas))
	}
}

func TestDueForRenewal(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		before, after time.Duration
		due           bool
	}{
		{-time.Hour, 3 * time.Hour, false}, // 3/4 left
		{-2 * time.Hour, time.Hour, false}, // exactly 1/3 left
		{-3 * time.Hour, time.Hour, true},  // 1/4 left
		{time.Minute, time.Hour, true},     // not yet valid
		{-2 * time.Hour, -time.Hour, true}, // expired
		{-90 * time.Minute, 45 * time.Minute, false},
	} {
		c := &x509.Certificate{NotBefore: now.Add(tc.before), NotAfter: now.Add(tc.after)}
		if got := dueForRenewal(c, now); got != tc.due {
			t.Errorf("valid %v..%v: due %v, want %v", tc.before, tc.after, got, tc.due)
		}
	}
}

// Without the webhook configuration (not applied yet) the check fails and is retried, but the
// certificate is written and the server may start.
func TestCertWithoutWebhookConfig(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).Build()
	dir := t.TempDir()
	r, _ := NewCertRotator(c, testCertOptions(dir))
	if err := r.Check(context.Background()); err == nil {
		t.Error("no error without the MutatingWebhookConfiguration")
	}
	select {
	case <-r.Ready():
	default:
		t.Error("not ready")
	}
	if _, err := tls.LoadX509KeyPair(filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")); err != nil {
		t.Error(err)
	}
}
