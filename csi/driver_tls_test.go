package csi

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

type tlsProbeServer struct{ mgmtpb.UnimplementedMgmtServer }

func (tlsProbeServer) SystemQuery(context.Context, *mgmtpb.SystemQueryReq) (*mgmtpb.SystemQueryResp, error) {
	return &mgmtpb.SystemQueryResp{}, nil
}

// The controller dials the engines with mutual TLS from its mounted directory, and a driver
// configured with neither a directory nor --insecure-control-plane does not start.
func TestDriverMutualTLS(t *testing.T) {
	if _, err := NewDriver(Config{Mode: ModeController, MgmtAddr: "127.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "--tls-dir") {
		t.Fatalf("a driver without TLS nor insecure: %v", err)
	}
	if _, err := NewDriver(Config{Mode: ModeController, MgmtAddr: "127.0.0.1:1", TLSDir: "/x", Insecure: true}); err == nil {
		t.Fatal("a driver with both a TLS directory and insecure")
	}

	ca, err := pki.NewCA("tank", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := ca.Issue(pki.EngineIdentity("tank", 0), time.Now(), time.Hour)
	pair, _ := tls.X509KeyPair(eng.CertPEM, eng.KeyPEM)
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{pair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool})))
	mgmtpb.RegisterMgmtServer(g, tlsProbeServer{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	defer g.Stop()

	dir := t.TempDir()
	d, err := NewDriver(Config{Mode: ModeController, MgmtAddr: l.Addr().String(), TLSDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	// The Secret not mounted yet: not ready, and ready once the files appear (read at each
	// connection, no restart).
	if err := d.Probe(context.Background()); err == nil {
		t.Fatal("probe answered without a certificate")
	}
	leaf, _ := ca.Issue(pki.Identity{System: "tank", Role: pki.RoleAdmin, Name: "csi-controller"}, time.Now(), time.Hour)
	for f, b := range map[string][]byte{pki.CAFile: ca.CertPEM(), pki.CertFile: leaf.CertPEM, pki.KeyFile: leaf.KeyPEM} {
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := d.Probe(context.Background())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("probe with the certificate: %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
