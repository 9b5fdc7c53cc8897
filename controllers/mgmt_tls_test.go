package controllers

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// tlsMgmtServer is a management service that serves as the engines do: its engine certificate,
// client certificates of its CA required. It records who called.
type tlsMgmtServer struct {
	mgmtpb.UnimplementedMgmtServer
	mu      sync.Mutex
	callers []string
}

func (s *tlsMgmtServer) SystemQuery(ctx context.Context, _ *mgmtpb.SystemQueryReq) (*mgmtpb.SystemQueryResp, error) {
	p, _ := peer.FromContext(ctx)
	info := p.AuthInfo.(credentials.TLSInfo)
	id, err := pki.ParseIdentity(info.State.PeerCertificates[0])
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.callers = append(s.callers, err.Error())
	} else {
		s.callers = append(s.callers, id.String())
	}
	return &mgmtpb.SystemQueryResp{}, nil
}

func serveTLSMgmt(t *testing.T, ca *pki.CA, system string) (string, *tlsMgmtServer) {
	t.Helper()
	leaf, err := ca.Issue(pki.EngineIdentity(system, 0), time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	srv := &tlsMgmtServer{}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{pair}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool,
	})))
	mgmtpb.RegisterMgmtServer(g, srv)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String(), srv
}

func caSecret(t *testing.T, ns, name string, ca *pki.CA) *corev1.Secret {
	t.Helper()
	key, err := ca.KeyPEM()
	if err != nil {
		t.Fatal(err)
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name + "-ca"},
		Data: map[string][]byte{pki.CAFile: ca.CertPEM(), pki.CAKeyFile: key}}
}

// The operator's management client dials with mutual TLS: its own certificate, issued in memory
// from the ServerSet's CA Secret (role admin), accepted by an engine of that system; it refuses
// an engine of another system, and plain HTTP/2 gets nowhere.
func TestOperatorClientMutualTLS(t *testing.T) {
	tank, err := pki.NewCA("tank", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	pond, err := pki.NewCA("pond", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	addr, srv := serveTLSMgmt(t, tank, "tank")
	reader := fake.NewClientBuilder().WithObjects(caSecret(t, "default", "tank", tank), caSecret(t, "default", "pond", pond)).Build()
	ms := &ManagementServices{Certs: &AdminCerts{Reader: reader}}
	defer ms.Close()
	call := func(target mgmtTarget) error {
		c, err := ms.Client(target)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = c.SystemQuery(ctx, &mgmtpb.SystemQueryReq{})
		return err
	}

	if err := call(mgmtTarget{Addr: addr, ServerSet: types.NamespacedName{Namespace: "default", Name: "tank"}, System: "tank"}); err != nil {
		t.Fatalf("operator -> tank's engine: %v", err)
	}
	srv.mu.Lock()
	got := strings.Join(srv.callers, ",")
	srv.mu.Unlock()
	if got != "peregrine://tank/admin/operator" {
		t.Fatalf("the engine saw %q, want the operator's admin certificate", got)
	}
	// The same address named as pond's: the client presents pond's certificate (refused by the
	// engine) and refuses tank's engine (not an engine of pond).
	if err := call(mgmtTarget{Addr: addr, ServerSet: types.NamespacedName{Namespace: "default", Name: "pond"}, System: "pond"}); err == nil {
		t.Fatal("operator with pond's certificate reached tank's engine")
	}
	if err := call(mgmtTarget{Addr: addr, Insecure: true}); err == nil {
		t.Fatal("plain HTTP/2 reached a TLS engine")
	}
	// No CA Secret: a clear error, no connection in the clear.
	err = call(mgmtTarget{Addr: addr, ServerSet: types.NamespacedName{Namespace: "default", Name: "none"}, System: "none"})
	if err == nil || !strings.Contains(err.Error(), "none-ca") {
		t.Fatalf("without a CA Secret: %v", err)
	}
}
