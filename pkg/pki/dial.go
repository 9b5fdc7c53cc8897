package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"
)

// Material is what a client of the engines presents and trusts.
type Material struct {
	// Cert is the client's certificate and key.
	Cert tls.Certificate
	// Roots are the CAs the engines' certificates must chain to (all of ca.crt).
	Roots *x509.CertPool
	// ID is the client's own identity; its System is the system the engines must belong to.
	ID Identity
}

// MaterialFromPEM checks and assembles the contents of a TLS directory.
func MaterialFromPEM(caPEM, certPEM, keyPEM []byte) (*Material, error) {
	cas, err := ParseCerts(caPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CAFile, err)
	}
	roots := x509.NewCertPool()
	for _, c := range cas {
		roots.AddCert(c)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s and %s: %w", CertFile, KeyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CertFile, err)
	}
	pair.Leaf = leaf
	id, err := ParseIdentity(leaf)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", CertFile, err)
	}
	return &Material{Cert: pair, Roots: roots, ID: id}, nil
}

// LoadDir reads ca.crt, tls.crt and tls.key from dir (a mounted Secret).
func LoadDir(dir string) (*Material, error) {
	var data [3][]byte
	for i, f := range []string{CAFile, CertFile, KeyFile} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return nil, fmt.Errorf("TLS directory %s: %w", dir, err)
		}
		data[i] = b
	}
	m, err := MaterialFromPEM(data[0], data[1], data[2])
	if err != nil {
		return nil, fmt.Errorf("TLS directory %s: %w", dir, err)
	}
	return m, nil
}

// Source gives the current material. It is asked on every TLS handshake: the files of a mounted
// Secret change under a running process when the operator renews a certificate or rotates the CA.
type Source func() (*Material, error)

// DirSource reads dir again when the last read is older than a few seconds (one handshake asks
// twice: for the client certificate and to verify the server).
func DirSource(dir string) Source {
	var (
		mu   sync.Mutex
		last *Material
		at   time.Time
	)
	return func() (*Material, error) {
		mu.Lock()
		defer mu.Unlock()
		if last != nil && time.Since(at) < 5*time.Second {
			return last, nil
		}
		m, err := LoadDir(dir)
		if err != nil {
			return nil, err
		}
		last, at = m, time.Now()
		return m, nil
	}
}

// StaticSource always gives m.
func StaticSource(m *Material) Source { return func() (*Material, error) { return m, nil } }

// ClientConfig is the TLS configuration of a client of the engines' gRPC: it presents the
// source's certificate and accepts a server only if its certificate chains to the source's CAs,
// carries the DNS SAN EngineServerName and server authentication, and names an engine of the
// client's own system (URI SAN peregrine://<system>/engine/<rank>).
//
// Go's own verification is replaced (InsecureSkipVerify with VerifyConnection doing all of it)
// only so that the CAs can change between handshakes; nothing is skipped.
func ClientConfig(src Source) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		ServerName:         EngineServerName,
		InsecureSkipVerify: true, //nolint:gosec // VerifyConnection verifies the chain, name and identity
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			m, err := src()
			if err != nil {
				return nil, err
			}
			return &m.Cert, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			m, err := src()
			if err != nil {
				return err
			}
			return VerifyEngine(cs.PeerCertificates, m, time.Now())
		},
	}
}

// VerifyEngine checks an engine's certificate chain as ClientConfig does.
func VerifyEngine(chain []*x509.Certificate, m *Material, now time.Time) error {
	if len(chain) == 0 {
		return errors.New("the engine sent no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{
		Roots: m.Roots, Intermediates: inter, DNSName: EngineServerName, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err != nil {
		return fmt.Errorf("engine certificate: %w", err)
	}
	id, err := ParseIdentity(chain[0])
	if err != nil {
		return fmt.Errorf("engine certificate: %w", err)
	}
	if id.Role != RoleEngine || id.System != m.ID.System {
		return fmt.Errorf("engine certificate names %s; want an engine of system %q", id, m.ID.System)
	}
	return nil
}

// Credentials are gRPC transport credentials over ClientConfig.
func Credentials(src Source) credentials.TransportCredentials {
	return credentials.NewTLS(ClientConfig(src))
}
