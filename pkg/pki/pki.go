// Package pki issues and checks the certificates of Peregrine's control plane (issue 20, point 1):
// a CA per system, and leaf certificates naming who holds them in a URI SAN
// peregrine://<system>/<role>/<name>. The engines (Rust) check the same names; the layout on disk is
// a Kubernetes kubernetes.io/tls Secret with an extra ca.crt key: ca.crt (PEM, every CA trusted,
// several during a CA rotation), tls.crt (PEM leaf), tls.key (PEM PKCS#8). Keys are ECDSA P-256.
//
// Only the standard library: the operator creates and rotates its CAs itself (no cert-manager).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Role is what a certificate lets its holder do on the engines.
type Role string

const (
	// RoleEngine is an engine of the system; Name is its rank.
	RoleEngine Role = "engine"
	// RoleAdmin may call every management RPC (the operator, the CSI controller, the CLI).
	RoleAdmin Role = "admin"
	// RoleClient may only make the mount and I/O queries (the CSI node plugin and its FUSE daemons).
	RoleClient Role = "client"
)

// File names in a TLS directory (and keys of the Secrets).
const (
	CAFile   = "ca.crt"
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	// CAKeyFile is the CA's private key, only in the CA Secret.
	CAKeyFile = "ca.key"
)

// EngineServerName is the DNS SAN of every engine certificate and the name clients verify
// (engines are reached by pod IPs and Service names that change; the URI SAN names the rank).
const EngineServerName = "peregrine-engine"

// URIScheme is the scheme of the identity URI SAN.
const URIScheme = "peregrine"

// Identity is who a leaf certificate is for.
type Identity struct {
	System string
	Role   Role
	Name   string
}

// EngineIdentity is the identity of rank `rank` of `system`.
func EngineIdentity(system string, rank int32) Identity {
	return Identity{System: system, Role: RoleEngine, Name: strconv.Itoa(int(rank))}
}

// URI is the URI SAN: peregrine://<system>/<role>/<name>.
func (id Identity) URI() *url.URL {
	return &url.URL{Scheme: URIScheme, Host: id.System, Path: "/" + string(id.Role) + "/" + id.Name}
}

func (id Identity) String() string { return id.URI().String() }

// Validate checks that the identity can be written as a URI and read back unchanged.
func (id Identity) Validate() error {
	switch id.Role {
	case RoleEngine, RoleAdmin, RoleClient:
	default:
		return fmt.Errorf("role %q: want engine, admin or client", id.Role)
	}
	if id.System == "" || strings.ContainsAny(id.System, "/:@?#% ") {
		return fmt.Errorf("system %q: want a non-empty name of letters, digits, '-', '_' or '.'", id.System)
	}
	if id.Name == "" || strings.ContainsAny(id.Name, "/:@?#% ") {
		return fmt.Errorf("name %q: want a non-empty name without '/'", id.Name)
	}
	if id.Role == RoleEngine {
		if _, err := strconv.ParseUint(id.Name, 10, 32); err != nil {
			return fmt.Errorf("engine name %q: want a decimal rank", id.Name)
		}
	}
	return nil
}

// ParseIdentity reads the peregrine:// URI SAN of a certificate (exactly one is allowed).
func ParseIdentity(c *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range c.URIs {
		if u.Scheme != URIScheme {
			continue
		}
		role, name, ok := strings.Cut(strings.TrimPrefix(u.Path, "/"), "/")
		if !ok {
			return Identity{}, fmt.Errorf("URI SAN %s: want %s://<system>/<role>/<name>", u, URIScheme)
		}
		id := Identity{System: u.Host, Role: Role(role), Name: name}
		if err := id.Validate(); err != nil {
			return Identity{}, fmt.Errorf("URI SAN %s: %w", u, err)
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("certificate %q has no %s:// URI SAN", c.Subject.CommonName, URIScheme)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("certificate %q has %d %s:// URI SANs; want one", c.Subject.CommonName, len(found), URIScheme)
}

// CA is a certificate authority: its certificate and key.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
}

// NewCA makes a self-signed CA for `system`, valid from now (less a minute of clock skew) for
// lifetime.
func NewCA(system string, now time.Time, lifetime time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	skid := keyID(&key.PublicKey)
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("peregrine CA %s %s", system, now.UTC().Format("20060102T150405Z")), Organization: []string{"Peregrine"}},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(lifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
		SubjectKeyId:          skid,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key}, nil
}

// CertPEM is the CA certificate in PEM.
func (ca *CA) CertPEM() []byte { return EncodeCerts(ca.Cert) }

// KeyPEM is the CA key in PEM (PKCS#8).
func (ca *CA) KeyPEM() ([]byte, error) { return EncodeKey(ca.Key) }

// Leaf is an issued certificate with its key, in PEM.
type Leaf struct {
	CertPEM, KeyPEM []byte
	Cert            *x509.Certificate
}

// Issue signs a leaf certificate for id, valid from now (less a minute) for lifetime, never past
// the CA's own expiry. Engines get the DNS SAN EngineServerName and both server and client
// authentication; admins and clients client authentication only.
func (ca *CA) Issue(id Identity, now time.Time, lifetime time.Duration) (*Leaf, error) {
	if err := id.Validate(); err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("key of %s: %w", id, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	notAfter := now.Add(lifetime)
	if notAfter.After(ca.Cert.NotAfter) {
		notAfter = ca.Cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial,
		Subject:        pkix.Name{CommonName: id.String(), Organization: []string{"Peregrine"}},
		NotBefore:      now.Add(-time.Minute),
		NotAfter:       notAfter,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		URIs:           []*url.URL{id.URI()},
		AuthorityKeyId: ca.Cert.SubjectKeyId,
	}
	if id.Role == RoleEngine {
		tmpl.DNSNames = []string{EngineServerName}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, fmt.Errorf("certificate of %s: %w", id, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	keyPEM, err := EncodeKey(key)
	if err != nil {
		return nil, err
	}
	return &Leaf{CertPEM: EncodeCerts(cert), KeyPEM: keyPEM, Cert: cert}, nil
}

// ParseCA reads a CA from its certificate and key in PEM, checking that they belong together.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return nil, err
	}
	if len(certs) != 1 {
		return nil, fmt.Errorf("CA certificate: want one, found %d", len(certs))
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return nil, err
	}
	if !certs[0].IsCA {
		return nil, errors.New("CA certificate: not a CA (basic constraints)")
	}
	if !SameKey(certs[0].PublicKey, &key.PublicKey) {
		return nil, errors.New("CA key does not match the CA certificate")
	}
	return &CA{Cert: certs[0], Key: key}, nil
}

// Signer picks, among the CA certificates of a bundle, the one whose key is key.
func Signer(bundle []*x509.Certificate, key *ecdsa.PrivateKey) (*CA, error) {
	for _, c := range bundle {
		if c.IsCA && SameKey(c.PublicKey, &key.PublicKey) {
			return &CA{Cert: c, Key: key}, nil
		}
	}
	return nil, errors.New("no CA certificate of the bundle matches the CA key")
}

// SameKey reports whether pub is the public half of the ECDSA key want.
func SameKey(pub crypto.PublicKey, want *ecdsa.PublicKey) bool {
	p, ok := pub.(*ecdsa.PublicKey)
	return ok && p.Equal(want)
}

// ParseCerts reads every CERTIFICATE block of a PEM bundle; anything else, or no certificate at
// all, is an error.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := data
	for {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("PEM block %q: want CERTIFICATE", b.Type)
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate: %w", err)
		}
		out = append(out, c)
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, errors.New("certificate PEM: trailing data that is not PEM")
	}
	if len(out) == 0 {
		return nil, errors.New("no PEM certificate")
	}
	return out, nil
}

// EncodeCerts writes certificates as one PEM bundle.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var b bytes.Buffer
	for _, c := range certs {
		_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return b.Bytes()
}

// ParseKey reads an ECDSA P-256 private key from PEM (PKCS#8, or SEC 1 "EC PRIVATE KEY").
func ParseKey(data []byte) (*ecdsa.PrivateKey, error) {
	b, _ := pem.Decode(data)
	if b == nil {
		return nil, errors.New("no PEM private key")
	}
	var key any
	var err error
	switch b.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(b.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(b.Bytes)
	default:
		return nil, fmt.Errorf("PEM block %q: want PRIVATE KEY", b.Type)
	}
	if err != nil {
		return nil, fmt.Errorf("private key: %w", err)
	}
	k, ok := key.(*ecdsa.PrivateKey)
	if !ok || k.Curve != elliptic.P256() {
		return nil, errors.New("private key: want ECDSA P-256")
	}
	return k, nil
}

// EncodeKey writes a private key as PEM PKCS#8.
func EncodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// Fingerprint is a short hash of a bundle's DER certificates (for logs, events and annotations).
func Fingerprint(certs ...*x509.Certificate) string {
	h := sha256.New()
	for _, c := range certs {
		h.Write(c.Raw)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// RenewAt is when a certificate is due for renewal: two thirds into its validity.
func RenewAt(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(life * 2 / 3)
}

// LeafProblem says why a stored leaf certificate cannot be kept ("" when it can).
type LeafProblem string

const (
	LeafOK LeafProblem = ""
	// LeafInvalid: missing, unparseable, or its key does not match.
	LeafInvalid LeafProblem = "Invalid"
	// LeafForged: not signed by the CA that should have signed it.
	LeafForged LeafProblem = "NotIssuedByCA"
	// LeafWrongIdentity: issued for another system, role or name.
	LeafWrongIdentity LeafProblem = "WrongIdentity"
	// LeafExpired: past its NotAfter (or not valid yet).
	LeafExpired LeafProblem = "Expired"
	// LeafRenewalDue: two thirds of its lifetime are over.
	LeafRenewalDue LeafProblem = "RenewalDue"
)

// CheckLeaf tells whether a stored certificate and key can be kept: they parse and belong
// together, the certificate was signed by signer, names want, and is valid at now and not yet due
// for renewal. The detail says what is wrong, for an event.
func CheckLeaf(certPEM, keyPEM []byte, signer *x509.Certificate, want Identity, now time.Time) (LeafProblem, string) {
	certs, err := ParseCerts(certPEM)
	if err != nil {
		return LeafInvalid, err.Error()
	}
	key, err := ParseKey(keyPEM)
	if err != nil {
		return LeafInvalid, err.Error()
	}
	c := certs[0]
	if !SameKey(c.PublicKey, &key.PublicKey) {
		return LeafInvalid, "the key does not match the certificate"
	}
	if err := c.CheckSignatureFrom(signer); err != nil {
		return LeafForged, fmt.Sprintf("not signed by CA %s: %v", Fingerprint(signer), err)
	}
	id, err := ParseIdentity(c)
	if err != nil {
		return LeafWrongIdentity, err.Error()
	}
	if id != want {
		return LeafWrongIdentity, fmt.Sprintf("issued for %s, want %s", id, want)
	}
	if now.Before(c.NotBefore) || !now.Before(c.NotAfter) {
		return LeafExpired, fmt.Sprintf("valid %s to %s", c.NotBefore.UTC().Format(time.RFC3339), c.NotAfter.UTC().Format(time.RFC3339))
	}
	if !now.Before(RenewAt(c)) {
		return LeafRenewalDue, fmt.Sprintf("two thirds of its validity (to %s) are over", c.NotAfter.UTC().Format(time.RFC3339))
	}
	return LeafOK, ""
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s, nil
}

func keyID(pub *ecdsa.PublicKey) []byte {
	b, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha256.Sum256(b)
	return sum[:20]
}
