package csi

// Kubelet plugin registration (what the node-driver-registrar sidecar does): a gRPC server of
// k8s.io/kubelet/pkg/apis/pluginregistration/v1 on a socket in kubelet's plugins_registry
// directory. Kubelet finds the socket, asks GetInfo, then dials the CSI endpoint it names and
// reports the outcome with NotifyRegistrationStatus.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	name     string
	endpoint string
	versions []string
	failed   chan string
}

func (s *registrationServer) GetInfo(ctx context.Context, req *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	slog.Info("csi registration: kubelet asked for the plugin's info", "name", s.name, "endpoint", s.endpoint)
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              s.name,
		Endpoint:          s.endpoint,
		SupportedVersions: s.versions,
	}, nil
}

func (s *registrationServer) NotifyRegistrationStatus(ctx context.Context, st *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if st.GetPluginRegistered() {
		slog.Info("csi registration: kubelet registered the plugin", "name", s.name)
	} else {
		slog.Error("csi registration: KUBELET REFUSED THE PLUGIN", "name", s.name, "error", st.GetError())
		select {
		case s.failed <- st.GetError():
		default:
		}
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

// ServeRegistration serves kubelet's plugin registration on socketPath (a stale socket left
// there is removed first) until ctx ends (then it returns nil and removes the socket) or
// kubelet reports a failed registration (then it returns that error: the caller should exit, so
// that a restart registers again, as node-driver-registrar does). csiEndpoint is the CSI
// socket's path as kubelet sees it (a "unix://" prefix is dropped: kubelet wants a path);
// versions default to "1.0.0".
func ServeRegistration(ctx context.Context, socketPath, driverName, csiEndpoint string, versions []string) error {
	if socketPath == "" || driverName == "" || csiEndpoint == "" {
		return errors.New("plugin registration: socket path, driver name and CSI endpoint are required")
	}
	endpoint := strings.TrimPrefix(strings.TrimPrefix(csiEndpoint, "unix://"), "unix:")
	if len(versions) == 0 {
		versions = []string{"1.0.0"}
	}
	if fi, err := os.Lstat(socketPath); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return fmt.Errorf("plugin registration: %s exists and is not a socket", socketPath)
		}
		if err := os.Remove(socketPath); err != nil {
			return fmt.Errorf("plugin registration: removing the stale socket: %w", err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("plugin registration: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(socketPath), 0o750); err != nil {
		return fmt.Errorf("plugin registration: %w", err)
	}
	l, err := net.Listen("unix", socketPath)
	if err != nil {
		return fmt.Errorf("plugin registration: %w", err)
	}
	srv := grpc.NewServer()
	rs := &registrationServer{name: driverName, endpoint: endpoint, versions: versions, failed: make(chan string, 1)}
	registerapi.RegisterRegistrationServer(srv, rs)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	slog.Info("csi registration: serving", "socket", socketPath, "name", driverName, "endpoint", endpoint, "versions", versions)
	defer func() { _ = os.Remove(socketPath) }()
	select {
	case <-ctx.Done():
		srv.GracefulStop()
		<-served
		return nil
	case msg := <-rs.failed:
		srv.GracefulStop() // the NotifyRegistrationStatus call gets its answer
		<-served
		return fmt.Errorf("kubelet refused the registration of %s (endpoint %s): %s", driverName, endpoint, msg)
	case err := <-served:
		return fmt.Errorf("plugin registration: %w", err)
	}
}
