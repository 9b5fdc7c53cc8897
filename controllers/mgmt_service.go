// Package controllers holds the reconcilers of ServerSet, Pool and Container. Every state the
// reconcilers report comes from the store's management service, reached through ManagementServices.
package controllers

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/types"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// ManagementServices hands out management API clients, one gRPC connection per address and
// identity, kept across reconciles (gRPC reconnects by itself when an engine restarts).
type ManagementServices struct {
	// CallTimeout bounds one management call (default 30 s: a format or a pool create touches
	// every engine).
	CallTimeout time.Duration
	// Certs issues the operator's own certificate for each system (mutual TLS); nil: only
	// insecure targets (and targets with their own Source) can be reached.
	Certs *AdminCerts

	mu         sync.Mutex
	conns      map[string]*grpc.ClientConn
	warnedOnce sync.Map
}

// mgmtTarget is a management service and how to reach it.
type mgmtTarget struct {
	Addr string
	// ServerSet whose CA issues the operator's certificate, and its engines' system name.
	ServerSet types.NamespacedName
	System    string
	// Insecure: the ServerSet's engines serve gRPC without TLS (spec.insecureControlPlane).
	Insecure bool
	// Source, when set, is the client certificate and CAs to use instead of the operator's
	// (tests, and engines outside the operator's CAs).
	Source pki.Source
}

// targetOf is the management service of ss at addr.
func targetOf(ss *storagev1.ServerSet, addr string) mgmtTarget {
	return mgmtTarget{Addr: addr, ServerSet: types.NamespacedName{Namespace: ss.Namespace, Name: ss.Name},
		System: systemName(ss), Insecure: ss.Spec.InsecureControlPlane}
}

func (t mgmtTarget) connKey() string {
	if t.Insecure {
		return t.Addr + "|insecure"
	}
	return t.Addr + "|" + t.ServerSet.String() + "|" + t.System
}

// Client returns a client of the management service t: mutual TLS with the operator's
// certificate for t's system (or t.Source), or plain TCP for an insecure ServerSet.
func (m *ManagementServices) Client(t mgmtTarget) (mgmtpb.MgmtClient, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := t.connKey()
	if c, ok := m.conns[key]; ok {
		return mgmtpb.NewMgmtClient(c), nil
	}
	var creds credentials.TransportCredentials
	switch {
	case t.Insecure:
		if _, warned := m.warnedOnce.LoadOrStore(t.ServerSet.String(), true); !warned {
			ctrllog.Log.WithName("mgmt").Info("WARNING: talking to the engines of an insecure control plane without TLS (spec.insecureControlPlane)",
				"serverset", t.ServerSet.String(), "address", t.Addr)
		}
		creds = insecure.NewCredentials()
	case t.Source != nil:
		creds = pki.Credentials(t.Source)
	case m.Certs != nil:
		creds = pki.Credentials(m.Certs.Source(t.ServerSet, t.System))
	default:
		return nil, fmt.Errorf("management service %s: no client certificate for system %q", t.Addr, t.System)
	}
	c, err := grpc.NewClient(t.Addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("management service %s: %w", t.Addr, err)
	}
	if m.conns == nil {
		m.conns = map[string]*grpc.ClientConn{}
	}
	m.conns[key] = c
	return mgmtpb.NewMgmtClient(c), nil
}

// Forget drops the connections to addr: the next Client dials again (and resolves the name
// again, and loads the certificates again).
func (m *ManagementServices) Forget(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for k, c := range m.conns {
		if strings.HasPrefix(k, addr+"|") {
			_ = c.Close()
			delete(m.conns, k)
		}
	}
}

// Close drops every connection.
func (m *ManagementServices) Close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for a, c := range m.conns {
		_ = c.Close()
		delete(m.conns, a)
	}
}

func (m *ManagementServices) callContext(ctx context.Context) (context.Context, context.CancelFunc) {
	t := m.CallTimeout
	if t == 0 {
		t = 30 * time.Second
	}
	return context.WithTimeout(ctx, t)
}

// grpcCode is the gRPC status code of err (codes.Unknown for non-gRPC errors).
func grpcCode(err error) codes.Code {
	return status.Code(err)
}

// grpcMessage is the management service's message of err, without the gRPC decoration.
func grpcMessage(err error) string {
	if s, ok := status.FromError(err); ok {
		return s.Message()
	}
	return err.Error()
}

// humanBytes prints a byte count with a binary unit, as the store's CLI does ("1.5GiB").
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	div, exp := uint64(unit), 0
	for x := n / unit; x >= unit && exp < 4; x /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f%ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// storeError is a failed management call: what was attempted on what, and the service's message.
// It keeps the gRPC status reachable for grpcCode.
type storeError struct {
	what string
	err  error
}

func (e *storeError) Error() string { return e.what + ": " + grpcMessage(e.err) }
func (e *storeError) Unwrap() error { return e.err }

func storeErr(err error, format string, args ...any) error {
	return &storeError{what: fmt.Sprintf(format, args...), err: err}
}
