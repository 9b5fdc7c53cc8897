package csi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/peregrine-storage/peregrine/internal/testengine"
)

// rtDial connects to a registration socket as kubelet's plugin watcher does (gRPC over unix).
func rtDial(t *testing.T, sock string) registerapi.RegistrationClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return registerapi.NewRegistrationClient(conn)
}

func rtWaitSocket(t *testing.T, sock string, served chan error) {
	t.Helper()
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("unix", sock); err == nil {
			_ = c.Close()
			return
		}
		select {
		case err := <-served:
			t.Fatalf("ServeRegistration ended: %v", err)
		default:
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s never accepted connections", sock)
}

// Registration as kubelet does it: GetInfo names a CSI plugin, its endpoint and versions;
// NotifyRegistrationStatus is acknowledged; a stale socket is replaced; the socket goes when
// the context ends.
func TestRegistration(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "plugins_registry", DriverName+"-reg.sock")
	// A stale socket from a previous run.
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() {
		served <- ServeRegistration(ctx, sock, DriverName, "unix:///var/lib/kubelet/plugins/csi.peregrine.dev/csi.sock", []string{"1.0.0"})
	}()
	rtWaitSocket(t, sock, served)
	c := rtDial(t, sock)
	cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
	defer ccancel()
	info, err := c.GetInfo(cctx, &registerapi.InfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != registerapi.CSIPlugin || info.Name != DriverName || info.Endpoint != "/var/lib/kubelet/plugins/csi.peregrine.dev/csi.sock" ||
		len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" {
		t.Fatalf("GetInfo: %v", info)
	}
	if _, err := c.NotifyRegistrationStatus(cctx, &registerapi.RegistrationStatus{PluginRegistered: true}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		t.Fatalf("ServeRegistration ended after a successful registration: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("ServeRegistration after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeRegistration did not end with its context")
	}
	if _, err := os.Lstat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left behind: %v", err)
	}
}

// A registration kubelet refuses ends ServeRegistration with kubelet's error; a path that is
// not a socket is never removed.
func TestRegistrationRefused(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "reg.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- ServeRegistration(ctx, sock, DriverName, "/csi/csi.sock", nil) }()
	rtWaitSocket(t, sock, served)
	c := rtDial(t, sock)
	info, err := c.GetInfo(ctx, &registerapi.InfoRequest{})
	if err != nil || len(info.SupportedVersions) != 1 || info.SupportedVersions[0] != "1.0.0" || info.Endpoint != "/csi/csi.sock" {
		t.Fatalf("GetInfo: %v, %v", info, err)
	}
	if _, err := c.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: false, Error: "version 9 not supported"}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err == nil || !strings.Contains(err.Error(), "version 9 not supported") {
			t.Fatalf("ServeRegistration after a refusal: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeRegistration did not report the refusal")
	}

	file := filepath.Join(dir, "plain-file")
	if err := os.WriteFile(file, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ServeRegistration(ctx, file, DriverName, "/csi/csi.sock", nil); err == nil {
		t.Fatal("ServeRegistration over a regular file")
	}
	if b, err := os.ReadFile(file); err != nil || string(b) != "keep me" {
		t.Fatalf("the regular file was touched: %q, %v", b, err)
	}
}

// /healthz answers 200 "ok" while the probe succeeds and 500 with its error when it fails.
func TestHealth(t *testing.T) {
	port, err := testengine.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var mu sync.Mutex
	var failure error
	setFailure := func(err error) { mu.Lock(); failure = err; mu.Unlock() }
	probe := func(ctx context.Context) error { mu.Lock(); defer mu.Unlock(); return failure }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	served := make(chan error, 1)
	go func() { served <- ServeHealth(ctx, addr, probe) }()
	get := func() (int, string) {
		t.Helper()
		var last error
		for i := 0; i < 200; i++ {
			r, err := http.Get("http://" + addr + "/healthz")
			if err == nil {
				b, _ := io.ReadAll(r.Body)
				_ = r.Body.Close()
				return r.StatusCode, string(b)
			}
			last = err
			time.Sleep(10 * time.Millisecond)
		}
		t.Fatalf("GET /healthz: %v", last)
		return 0, ""
	}
	if code, body := get(); code != http.StatusOK || strings.TrimSpace(body) != "ok" {
		t.Fatalf("healthy: %d %q", code, body)
	}
	setFailure(errors.New("peregrine-fuse binary missing"))
	if code, body := get(); code != http.StatusInternalServerError || !strings.Contains(body, "peregrine-fuse binary missing") {
		t.Fatalf("unhealthy: %d %q", code, body)
	}
	setFailure(nil)
	if code, _ := get(); code != http.StatusOK {
		t.Fatalf("healthy again: %d", code)
	}
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeHealth did not end with its context")
	}
}
