// Package controllers holds the reconcilers of ServerSet, Pool and Container. Every state the
// reconcilers report comes from the store's management service, reached through ManagementServices.
package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// ManagementServices hands out management API clients, one gRPC connection per address, kept
// across reconciles (gRPC reconnects by itself when an engine restarts).
type ManagementServices struct {
	// CallTimeout bounds one management call (default 30 s: a format or a pool create touches
	// every engine).
	CallTimeout time.Duration

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
}

// Client returns a client of the management service at addr ("host:port").
func (m *ManagementServices) Client(addr string) (mgmtpb.MgmtClient, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.conns[addr]; ok {
		return mgmtpb.NewMgmtClient(c), nil
	}
	c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("management service %s: %w", addr, err)
	}
	if m.conns == nil {
		m.conns = map[string]*grpc.ClientConn{}
	}
	m.conns[addr] = c
	return mgmtpb.NewMgmtClient(c), nil
}

// Forget drops the connection to addr: the next Client dials again (and resolves the name again).
func (m *ManagementServices) Forget(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if c, ok := m.conns[addr]; ok {
		_ = c.Close()
		delete(m.conns, addr)
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
