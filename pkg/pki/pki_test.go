package pki

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustCA(t *testing.T, system string) *CA {
	t.Helper()
	ca, err := NewCA(system, t0, 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func mustIssue(t *testing.T, ca *CA, id Identity, now time.Time, life time.Duration) *Leaf {
	t.Helper()
	l, err := ca.Issue(id, now, life)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestIssueCarriesTheContract(t *testing.T) {
	ca := mustCA(t, "tank")
	keyPEM, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	back, err := ParseCA(ca.CertPEM(), keyPEM)
	if err != nil || !back.Cert.Equal(ca.Cert) {
		t.Fatalf("CA round trip: %v", err)
	}
	eng := mustIssue(t, ca, EngineIdentity("tank", 2), t0, 90*24*time.Hour)
	if got := eng.Cert.URIs[0].String(); got != "peregrine://tank/engine/2" {
		t.Fatalf("engine URI SAN %q", got)
	}
	if len(eng.Cert.DNSNames) != 1 || eng.Cert.DNSNames[0] != EngineServerName {
		t.Fatalf("engine DNS SANs %v", eng.Cert.DNSNames)
	}
	if len(eng.Cert.ExtKeyUsage) != 2 {
		t.Fatalf("engine EKU %v", eng.Cert.ExtKeyUsage)
	}
	if !strings.HasPrefix(string(eng.KeyPEM), "-----BEGIN PRIVATE KEY-----") {
		t.Fatalf("key is not PKCS#8 PEM: %.40s", eng.KeyPEM)
	}
	adm := mustIssue(t, ca, Identity{System: "tank", Role: RoleAdmin, Name: "operator"}, t0, time.Hour)
	if len(adm.Cert.DNSNames) != 0 || len(adm.Cert.ExtKeyUsage) != 1 || adm.Cert.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
		t.Fatalf("admin SANs/EKU: %v %v", adm.Cert.DNSNames, adm.Cert.ExtKeyUsage)
	}
	id, err := ParseIdentity(adm.Cert)
	if err != nil || id != (Identity{System: "tank", Role: RoleAdmin, Name: "operator"}) {
		t.Fatalf("ParseIdentity: %v %v", id, err)
	}
	// A leaf never outlives its CA.
	long := mustIssue(t, ca, EngineIdentity("tank", 0), t0, 10*365*24*time.Hour)
	if !long.Cert.NotAfter.Equal(ca.Cert.NotAfter) {
		t.Fatalf("leaf NotAfter %v past the CA's %v", long.Cert.NotAfter, ca.Cert.NotAfter)
	}
	for _, bad := range []Identity{
		{System: "tank", Role: "root", Name: "x"},
		{System: "", Role: RoleAdmin, Name: "x"},
		{System: "tank", Role: RoleEngine, Name: "zero"},
		{System: "a/b", Role: RoleAdmin, Name: "x"},
	} {
		if _, err := ca.Issue(bad, t0, time.Hour); err == nil {
			t.Errorf("issued for invalid identity %+v", bad)
		}
	}
}

func TestCheckLeaf(t *testing.T) {
	ca, other := mustCA(t, "tank"), mustCA(t, "tank")
	id := EngineIdentity("tank", 1)
	life := 90 * 24 * time.Hour
	good := mustIssue(t, ca, id, t0, life)
	forged := mustIssue(t, other, id, t0, life)
	wrong := mustIssue(t, ca, EngineIdentity("tank", 2), t0, life)
	otherSys := mustIssue(t, ca, EngineIdentity("pond", 1), t0, life)
	for _, c := range []struct {
		name      string
		cert, key []byte
		now       time.Time
		want      LeafProblem
	}{
		{"good", good.CertPEM, good.KeyPEM, t0.Add(time.Hour), LeafOK},
		{"missing", nil, nil, t0, LeafInvalid},
		{"key of another", good.CertPEM, wrong.KeyPEM, t0, LeafInvalid},
		{"forged", forged.CertPEM, forged.KeyPEM, t0, LeafForged},
		{"other rank", wrong.CertPEM, wrong.KeyPEM, t0, LeafWrongIdentity},
		{"other system", otherSys.CertPEM, otherSys.KeyPEM, t0, LeafWrongIdentity},
		{"renewal due at 2/3", good.CertPEM, good.KeyPEM, t0.Add(61 * 24 * time.Hour), LeafRenewalDue},
		{"not yet due at 1/2", good.CertPEM, good.KeyPEM, t0.Add(45 * 24 * time.Hour), LeafOK},
		{"expired", good.CertPEM, good.KeyPEM, t0.Add(91 * 24 * time.Hour), LeafExpired},
	} {
		got, detail := CheckLeaf(c.cert, c.key, ca.Cert, id, c.now)
		if got != c.want {
			t.Errorf("%s: got %q (%s), want %q", c.name, got, detail, c.want)
		}
	}
}

func TestSignerAndBundles(t *testing.T) {
	a, b := mustCA(t, "tank"), mustCA(t, "tank")
	bundle := append(EncodeCerts(a.Cert), b.CertPEM()...)
	certs, err := ParseCerts(bundle)
	if err != nil || len(certs) != 2 {
		t.Fatalf("bundle: %d certs, %v", len(certs), err)
	}
	s, err := Signer(certs, b.Key)
	if err != nil || !s.Cert.Equal(b.Cert) {
		t.Fatalf("Signer: %v", err)
	}
	if _, err := Signer(certs[:1], b.Key); err == nil {
		t.Fatal("Signer found a CA for a key of none")
	}
	if _, err := ParseCerts([]byte("garbage")); err == nil {
		t.Fatal("ParseCerts accepted garbage")
	}
	keyPEM, _ := a.KeyPEM()
	if _, err := ParseCA(b.CertPEM(), keyPEM); err == nil {
		t.Fatal("ParseCA accepted a key of another CA")
	}
}

// engineServer serves TLS as an engine would (client certificates required, from roots) and
// reports each handshake's outcome.
func engineServer(t *testing.T, leaf *Leaf, roots ...*CA) (string, chan error) {
	t.Helper()
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	for _, r := range roots {
		pool.AddCert(r.Cert)
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	results := make(chan error, 16)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				err := c.(*tls.Conn).Handshake()
				if err == nil {
					_, err = c.Write([]byte("ok"))
				}
				results <- err
			}()
		}
	}()
	return l.Addr().String(), results
}

func dial(addr string, src Source) error {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, ClientConfig(src))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = io.ReadFull(c, make([]byte, 2))
	return err
}

func material(t *testing.T, leaf *Leaf, cas ...*CA) *Material {
	t.Helper()
	var bundle []byte
	for _, ca := range cas {
		bundle = append(bundle, ca.CertPEM()...)
	}
	m, err := MaterialFromPEM(bundle, leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestClientConfigMutualTLS(t *testing.T) {
	now := time.Now()
	ca, rogue := mustCA(t, "tank"), mustCA(t, "tank")
	ca2, _ := NewCA("tank", now, time.Hour)
	engine := mustIssue(t, ca, EngineIdentity("tank", 0), now, time.Hour)
	admin := mustIssue(t, ca, Identity{System: "tank", Role: RoleAdmin, Name: "operator"}, now, time.Hour)
	addr, _ := engineServer(t, engine, ca)

	if err := dial(addr, StaticSource(material(t, admin, ca))); err != nil {
		t.Fatalf("admin of the system: %v", err)
	}
	// The client refuses an engine of another system, even from the same CA.
	pondAdmin := mustIssue(t, ca, Identity{System: "pond", Role: RoleAdmin, Name: "operator"}, now, time.Hour)
	if err := dial(addr, StaticSource(material(t, pondAdmin, ca))); err == nil || !strings.Contains(err.Error(), "want an engine of system \"pond\"") {
		t.Fatalf("admin of pond accepted tank's engine: %v", err)
	}
	// The engine refuses a client certificate of another CA.
	forged := mustIssue(t, rogue, Identity{System: "tank", Role: RoleAdmin, Name: "operator"}, now, time.Hour)
	if err := dial(addr, StaticSource(material(t, forged, ca))); err == nil {
		t.Fatal("a client certificate of a rogue CA was accepted")
	}
	// The client refuses an engine whose CA it does not trust; a rotation bundle trusts both.
	if err := dial(addr, StaticSource(material(t, admin, ca2))); err == nil || !strings.Contains(err.Error(), "unknown authority") {
		t.Fatalf("engine of an untrusted CA accepted: %v", err)
	}
	if err := dial(addr, StaticSource(material(t, admin, ca2, ca))); err != nil {
		t.Fatalf("bundle of two CAs: %v", err)
	}
	// A non-engine certificate serving is refused (no serverAuth, no engine identity).
	impostor := mustIssue(t, ca, Identity{System: "tank", Role: RoleAdmin, Name: "x"}, now, time.Hour)
	addr2, _ := engineServer(t, impostor, ca)
	if err := dial(addr2, StaticSource(material(t, admin, ca))); err == nil {
		t.Fatal("an admin certificate was accepted as an engine's")
	}
}

func TestDirSource(t *testing.T) {
	ca := mustCA(t, "tank")
	leaf := mustIssue(t, ca, Identity{System: "tank", Role: RoleClient, Name: "csi-node"}, t0, time.Hour)
	dir := t.TempDir()
	if _, err := LoadDir(dir); err == nil {
		t.Fatal("LoadDir of an empty directory")
	}
	for f, b := range map[string][]byte{CAFile: ca.CertPEM(), CertFile: leaf.CertPEM, KeyFile: leaf.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	m, err := DirSource(dir)()
	if err != nil || m.ID.Role != RoleClient || m.ID.System != "tank" {
		t.Fatalf("DirSource: %+v %v", m, err)
	}
}
