package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// The operator keeps the webhook's certificate in a Secret of its own namespace and sets the
// caBundle of the webhook configuration (cluster-scoped).
// +kubebuilder:rbac:groups="",namespace=peregrine-system,resources=secrets,verbs=get;list;watch;create;update;patch
// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;list;watch;update;patch

// Keys of the certificate Secret.
const (
	SecretCertKey   = corev1.TLSCertKey       // tls.crt: the serving certificate
	SecretKeyKey    = corev1.TLSPrivateKeyKey // tls.key: its key
	SecretCAKey     = "ca.crt"                // the CA bundle: the current CA first, then older unexpired ones
	SecretCAPrivKey = "ca.key"                // the current CA's key, to sign the next serving certificate
)

// Defaults of CertOptions.
const (
	DefaultSecretName    = "peregrine-webhook-cert"
	DefaultCertLifetime  = 365 * 24 * time.Hour
	DefaultCALifetime    = 10 * 365 * 24 * time.Hour
	DefaultCheckInterval = time.Hour
)

// CertOptions configure a CertRotator.
type CertOptions struct {
	// Namespace of the Service and the Secret.
	Namespace string
	// ServiceName is the webhook Service; the certificate is for ServiceName.Namespace.svc.
	ServiceName string
	// SecretName holds the CA and the serving certificate (DefaultSecretName when empty).
	SecretName string
	// WebhookConfigName is the MutatingWebhookConfiguration whose caBundle is kept (none when empty).
	WebhookConfigName string
	// CertDir is the webhook server's certificate directory: tls.crt, tls.key and ca.crt are written
	// there.
	CertDir string
	// CertLifetime and CALifetime are the validity of new certificates; each is renewed when less
	// than a third of its lifetime is left.
	CertLifetime time.Duration
	CALifetime   time.Duration
	// CheckInterval is how often the Secret, the files and the caBundle are checked.
	CheckInterval time.Duration
}

func (o *CertOptions) setDefaults() {
	if o.SecretName == "" {
		o.SecretName = DefaultSecretName
	}
	if o.CertLifetime <= 0 {
		o.CertLifetime = DefaultCertLifetime
	}
	if o.CALifetime <= 0 {
		o.CALifetime = DefaultCALifetime
	}
	if o.CheckInterval <= 0 {
		o.CheckInterval = DefaultCheckInterval
	}
}

// DNSNames are the names the serving certificate is for.
func (o CertOptions) DNSNames() []string {
	svc := o.ServiceName + "." + o.Namespace + ".svc"
	return []string{svc, svc + ".cluster.local"}
}

// CertRotator is a manager Runnable that keeps the webhook's TLS certificate: the Secret, the files
// in CertDir and the webhook configuration's caBundle. It runs on every replica (no leader
// election): each one serves the webhook.
type CertRotator struct {
	opts   CertOptions
	client client.Client
	log    logr.Logger
	now    func() time.Time

	readyOnce sync.Once
	ready     chan struct{}
}

// NewCertRotator returns a rotator that talks to the API server with c. c should read directly from
// the API server (not a manager's cache, which would watch every Secret in the cluster).
func NewCertRotator(c client.Client, opts CertOptions) (*CertRotator, error) {
	opts.setDefaults()
	if opts.Namespace == "" || opts.ServiceName == "" || opts.CertDir == "" {
		return nil, errors.New("webhook certificates: namespace, service name and certificate directory are required")
	}
	return &CertRotator{
		opts:   opts,
		client: c,
		log:    ctrllog.Log.WithName("webhook-certs"),
		now:    time.Now,
		ready:  make(chan struct{}),
	}, nil
}

// Ready is closed once the certificate files have first been written to CertDir.
func (r *CertRotator) Ready() <-chan struct{} { return r.ready }

// NeedLeaderElection implements manager.LeaderElectionRunnable: every replica serves the webhook.
func (r *CertRotator) NeedLeaderElection() bool { return false }

// Start implements manager.Runnable: check now, then every CheckInterval; after a failure retry
// sooner (from 1 second, doubling up to CheckInterval).
func (r *CertRotator) Start(ctx context.Context) error {
	backoff := time.Second
	for {
		wait := r.opts.CheckInterval
		if err := r.Check(ctx); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			r.log.Error(err, "webhook certificate check failed; retrying", "after", backoff)
			wait = min(backoff, r.opts.CheckInterval)
			backoff *= 2
		} else {
			backoff = time.Second
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// Check makes the Secret hold a CA and a serving certificate that are valid and not due for
// renewal, writes them into CertDir and sets the caBundle. The Secret is the source of truth:
// whatever another replica stored there first is used.
func (r *CertRotator) Check(ctx context.Context) error {
	secret, err := r.ensureSecret(ctx)
	if err != nil {
		return err
	}
	// The caBundle first: after a CA renewal it holds the new CA and the old one, so the API server
	// trusts the new certificate by the time this server presents it, and still trusts the old one
	// (which other replicas may be serving). When the caBundle cannot be set (the webhook
	// configuration is not there yet), the files are written all the same and the check retried.
	bundleErr := r.ensureCABundle(ctx, secret.Data[SecretCAKey])
	if err := r.writeFiles(secret); err != nil {
		return errors.Join(err, bundleErr)
	}
	r.readyOnce.Do(func() { close(r.ready) })
	return bundleErr
}

func (r *CertRotator) ensureSecret(ctx context.Context) (*corev1.Secret, error) {
	key := types.NamespacedName{Namespace: r.opts.Namespace, Name: r.opts.SecretName}
	for attempt := 0; attempt < 5; attempt++ {
		secret := &corev1.Secret{}
		err := r.client.Get(ctx, key, secret)
		if apierrors.IsNotFound(err) {
			data, err := r.renew(nil)
			if err != nil {
				return nil, err
			}
			secret = &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{
					Namespace: key.Namespace, Name: key.Name,
					Labels: map[string]string{"app.kubernetes.io/managed-by": "peregrine-operator"},
				},
				Type: corev1.SecretTypeTLS,
				Data: data,
			}
			err = r.client.Create(ctx, secret)
			if apierrors.IsAlreadyExists(err) {
				continue // another replica made it: use theirs
			}
			if err != nil {
				return nil, fmt.Errorf("create Secret %s: %w", key, err)
			}
			r.log.Info("created the webhook certificate", "secret", key, "notAfter", notAfter(data))
			return secret, nil
		}
		if err != nil {
			return nil, fmt.Errorf("get Secret %s: %w", key, err)
		}
		data, err := r.renew(secret.Data)
		if err != nil {
			return nil, err
		}
		if data == nil {
			return secret, nil
		}
		secret.Data = data
		err = r.client.Update(ctx, secret) // optimistic: carries the resourceVersion we read
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			continue // another replica renewed (or it was deleted): re-read
		}
		if err != nil {
			return nil, fmt.Errorf("update Secret %s: %w", key, err)
		}
		r.log.Info("renewed the webhook certificate", "secret", key, "notAfter", notAfter(data))
		return secret, nil
	}
	return nil, fmt.Errorf("secret %s: kept conflicting with other writers", key)
}

// renew returns the Secret data to store, or nil when data needs nothing.
func (r *CertRotator) renew(data map[string][]byte) (map[string][]byte, error) {
	now := r.now()
	ca, caKey, olderCAs := parseCA(data, now)
	caRenewed := false
	if ca == nil || dueForRenewal(ca, now) {
		if ca != nil {
			olderCAs = append([]*x509.Certificate{ca}, olderCAs...)
		}
		var err error
		ca, caKey, err = newCA(now, r.opts.CALifetime)
		if err != nil {
			return nil, err
		}
		caRenewed = true
	}
	// The bundle: the current CA, then older CAs that still vouch for certificates some replica may
	// be serving. Expired ones drop out.
	bundle := pemCert(ca.Raw)
	for _, old := range olderCAs {
		if now.Before(old.NotAfter) {
			bundle = append(bundle, pemCert(old.Raw)...)
		}
	}
	out := map[string][]byte{
		SecretCAKey:     bundle,
		SecretCAPrivKey: data[SecretCAPrivKey],
		SecretCertKey:   data[SecretCertKey],
		SecretKeyKey:    data[SecretKeyKey],
	}
	if caRenewed {
		keyPEM, err := pemKey(caKey)
		if err != nil {
			return nil, err
		}
		out[SecretCAPrivKey] = keyPEM
	}
	if caRenewed || !r.servingCertGood(data, ca, now) {
		certPEM, keyPEM, err := newServingCert(ca, caKey, r.opts.DNSNames(), now, r.opts.CertLifetime)
		if err != nil {
			return nil, err
		}
		out[SecretCertKey], out[SecretKeyKey] = certPEM, keyPEM
	}
	for k, v := range out {
		if !bytes.Equal(data[k], v) {
			return out, nil
		}
	}
	return nil, nil
}

// parseCA returns the current CA (the first certificate of ca.crt, with the key in ca.key) and the
// other CAs of the bundle; ca is nil when either is missing, invalid or they do not match.
func parseCA(data map[string][]byte, now time.Time) (ca *x509.Certificate, key *ecdsa.PrivateKey, older []*x509.Certificate) {
	certs := parseCerts(data[SecretCAKey])
	if len(certs) == 0 {
		return nil, nil, nil
	}
	key = parseKey(data[SecretCAPrivKey])
	first := certs[0]
	if key == nil || !first.IsCA || !now.Before(first.NotAfter) || !key.PublicKey.Equal(first.PublicKey) {
		return nil, nil, certs
	}
	return first, key, certs[1:]
}

// servingCertGood reports whether data holds a serving certificate and key that match, are signed
// by ca, name the service and are not due for renewal.
func (r *CertRotator) servingCertGood(data map[string][]byte, ca *x509.Certificate, now time.Time) bool {
	certs := parseCerts(data[SecretCertKey])
	key := parseKey(data[SecretKeyKey])
	if len(certs) == 0 || key == nil || !key.PublicKey.Equal(certs[0].PublicKey) {
		return false
	}
	cert := certs[0]
	if dueForRenewal(cert, now) {
		return false
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	for _, name := range r.opts.DNSNames() {
		if _, err := cert.Verify(x509.VerifyOptions{
			DNSName: name, Roots: roots, CurrentTime: now,
			KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		}); err != nil {
			return false
		}
	}
	return true
}

// dueForRenewal: not yet valid, or less than a third of the certificate's lifetime left.
func dueForRenewal(c *x509.Certificate, now time.Time) bool {
	lifetime := c.NotAfter.Sub(c.NotBefore)
	return now.Before(c.NotBefore) || c.NotAfter.Sub(now) < lifetime/3
}

// backdate is how far before now a new certificate becomes valid, for clocks a little behind.
func backdate(lifetime time.Duration) time.Duration {
	return min(time.Hour, lifetime/100)
}

func newCA(now time.Time, lifetime time.Duration) (*x509.Certificate, *ecdsa.PrivateKey, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "peregrine-webhook-ca", Organization: []string{"Peregrine"}},
		NotBefore:             now.Add(-backdate(lifetime)),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	return cert, key, err
}

func newServingCert(ca *x509.Certificate, caKey *ecdsa.PrivateKey, dnsNames []string, now time.Time, lifetime time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, nil, err
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.NotAfter) {
		notAfter = ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: dnsNames[0]},
		DNSNames:     dnsNames,
		NotBefore:    now.Add(-backdate(lifetime)),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = pemKey(key)
	return pemCert(der), keyPEM, err
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
}

func pemCert(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func pemKey(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseCerts(data []byte) []*x509.Certificate {
	var out []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return out
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		if c, err := x509.ParseCertificate(block.Bytes); err == nil {
			out = append(out, c)
		}
	}
}

func parseKey(data []byte) *ecdsa.PrivateKey {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil
	}
	if k, err := x509.ParseECPrivateKey(block.Bytes); err == nil {
		return k
	}
	if k, err := x509.ParsePKCS8PrivateKey(block.Bytes); err == nil {
		if ek, ok := k.(*ecdsa.PrivateKey); ok {
			return ek
		}
	}
	return nil
}

func notAfter(data map[string][]byte) time.Time {
	if certs := parseCerts(data[SecretCertKey]); len(certs) > 0 {
		return certs[0].NotAfter
	}
	return time.Time{}
}

// writeFiles puts the Secret's certificate, key and CA bundle into CertDir when they differ. Each
// file is replaced by a rename, so a reader never sees half a file; controller-runtime's
// certwatcher notices (fsnotify, and a re-read every 10 seconds) and serves the new pair. Between
// the two renames it may read a key that does not match the certificate; it logs that and keeps
// serving the previous pair until the next event.
func (r *CertRotator) writeFiles(secret *corev1.Secret) error {
	if err := os.MkdirAll(r.opts.CertDir, 0o700); err != nil {
		return err
	}
	wrote := false
	for _, name := range []string{SecretKeyKey, SecretCertKey, SecretCAKey} {
		p := filepath.Join(r.opts.CertDir, name)
		want := secret.Data[name]
		if have, err := os.ReadFile(p); err == nil && bytes.Equal(have, want) {
			continue
		}
		tmp, err := os.CreateTemp(r.opts.CertDir, "."+name+".*")
		if err != nil {
			return err
		}
		_, err = tmp.Write(want)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Chmod(tmp.Name(), 0o600)
		}
		if err == nil {
			err = os.Rename(tmp.Name(), p)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
			return fmt.Errorf("write %s: %w", p, err)
		}
		wrote = true
	}
	if wrote {
		r.log.Info("wrote the webhook certificate", "dir", r.opts.CertDir, "notAfter", notAfter(secret.Data))
	}
	return nil
}

// ensureCABundle sets caBundle on every webhook of the configuration.
func (r *CertRotator) ensureCABundle(ctx context.Context, bundle []byte) error {
	if r.opts.WebhookConfigName == "" {
		return nil
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cfg := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := r.client.Get(ctx, types.NamespacedName{Name: r.opts.WebhookConfigName}, cfg); err != nil {
			return fmt.Errorf("get MutatingWebhookConfiguration %s: %w", r.opts.WebhookConfigName, err)
		}
		changed := false
		for i := range cfg.Webhooks {
			if !bytes.Equal(cfg.Webhooks[i].ClientConfig.CABundle, bundle) {
				cfg.Webhooks[i].ClientConfig.CABundle = bundle
				changed = true
			}
		}
		if !changed {
			return nil
		}
		if err := r.client.Update(ctx, cfg); err != nil {
			return err
		}
		r.log.Info("set the caBundle", "mutatingwebhookconfiguration", cfg.Name)
		return nil
	})
}
