package csi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// Mode says which CSI services one process serves.
type Mode int

const (
	// ModeController serves identity and controller (one Deployment per cluster, with the
	// provisioner, resizer and snapshotter sidecars).
	ModeController Mode = iota
	// ModeNode serves identity and node (a DaemonSet).
	ModeNode
	// ModeAll serves everything (one process on one machine; csi-sanity).
	ModeAll
)

// ParseMode parses "controller", "node" or "all".
func ParseMode(s string) (Mode, error) {
	switch s {
	case "controller":
		return ModeController, nil
	case "node":
		return ModeNode, nil
	case "all":
		return ModeAll, nil
	}
	return 0, fmt.Errorf("mode %q: want controller, node or all", s)
}

// Config is the driver's configuration.
type Config struct {
	Mode    Mode
	Version string
	// Endpoint is where the CSI gRPC service listens: unix:///path/csi.sock (or a plain path).
	Endpoint string
	// MgmtAddr is the management service (host:port).
	MgmtAddr string
	// DefaultPool serves StorageClasses that name no pool ("": the parameter is required).
	DefaultPool string
	// TLSDir holds the driver's certificate (ca.crt, tls.crt, tls.key: the operator's Secret
	// peregrine-csi-controller-tls or peregrine-csi-node-tls, mounted); it is read again at every
	// connection, so renewals and CA rotations need no restart.
	TLSDir string
	// Insecure talks to the engines without TLS (their ServerSet has spec.insecureControlPlane);
	// exactly one of TLSDir and Insecure.
	Insecure bool
	// FuseTLSDir (node) is the FUSE daemons' certificate, role client (default TLSDir): the node
	// plugin's own may be admin (inline ephemeral volumes), the daemons' need not.
	FuseTLSDir string
	// Node is the node service's configuration (ModeNode, ModeAll).
	Node NodeConfig
}

// Driver is the CSI driver: identity, and controller and/or node services by Mode.
type Driver struct {
	cfg  Config
	conn *grpc.ClientConn
	ms   mgmtpb.MgmtClient
	ctrl *ControllerServer
	node *NodeServer
}

// NewDriver connects to the management service (lazily: gRPC reconnects on its own) and, in
// node mode, re-adopts the volumes the node had staged.
func NewDriver(cfg Config) (*Driver, error) {
	if cfg.MgmtAddr == "" {
		return nil, errors.New("csi: no management service address")
	}
	creds, err := transportCredentials(cfg)
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(cfg.MgmtAddr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("csi: management service %s: %w", cfg.MgmtAddr, err)
	}
	d := &Driver{cfg: cfg, conn: conn, ms: mgmtpb.NewMgmtClient(conn)}
	d.ctrl = &ControllerServer{ms: d.ms, defaultPool: cfg.DefaultPool}
	if cfg.Mode != ModeController {
		nc := cfg.Node
		if nc.MgmtAddr == "" {
			nc.MgmtAddr = cfg.MgmtAddr
		}
		nc.TLSDir, nc.FuseTLSDir, nc.Insecure = cfg.TLSDir, cfg.FuseTLSDir, cfg.Insecure
		if nc.Ephemeral == nil {
			nc.Ephemeral = d.ctrl
		}
		if nc.Mgmt == nil {
			nc.Mgmt = d.ms
		}
		if d.node, err = NewNodeServer(nc); err != nil {
			_ = conn.Close()
			return nil, err
		}
	}
	return d, nil
}

// transportCredentials are mutual TLS from cfg.TLSDir, or none with cfg.Insecure (logged as a
// warning); one of them is required, so that no driver talks in the clear by omission.
func transportCredentials(cfg Config) (credentials.TransportCredentials, error) {
	switch {
	case cfg.Insecure && cfg.TLSDir != "":
		return nil, errors.New("csi: --tls-dir and --insecure-control-plane exclude each other")
	case cfg.Insecure:
		slog.Warn("csi: WARNING: talking to the engines without TLS (--insecure-control-plane): anyone on the network path can read and forge management calls")
		return insecure.NewCredentials(), nil
	case cfg.TLSDir != "":
		// Checked once here so that a missing mount fails the start, not the first call.
		if _, err := pki.LoadDir(cfg.TLSDir); err != nil {
			slog.Warn("csi: the TLS directory is not readable yet; calls fail until it is", "error", err)
		}
		return pki.Credentials(pki.DirSource(cfg.TLSDir)), nil
	}
	return nil, errors.New("csi: no TLS directory (--tls-dir) for the engines' control plane; --insecure-control-plane talks to them without TLS")
}

// Close drops the management connection.
func (d *Driver) Close() error { return d.conn.Close() }

// Listen opens the CSI endpoint (a unix socket; a stale socket file is removed first).
func Listen(endpoint string) (net.Listener, error) {
	path := endpoint
	if strings.Contains(endpoint, "://") {
		u, err := url.Parse(endpoint)
		if err != nil || u.Scheme != "unix" {
			return nil, fmt.Errorf("endpoint %q: want unix:///path/to/csi.sock", endpoint)
		}
		path = u.Path
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("endpoint %s: %w", path, err)
	}
	return net.Listen("unix", path)
}

// Server is the gRPC server with the driver's services registered.
func (d *Driver) Server() *grpc.Server {
	s := grpc.NewServer(grpc.ChainUnaryInterceptor(logCalls))
	csipb.RegisterIdentityServer(s, &IdentityServer{d: d})
	if d.cfg.Mode != ModeNode {
		csipb.RegisterControllerServer(s, d.ctrl)
	}
	if d.node != nil {
		csipb.RegisterNodeServer(s, d.node)
	}
	return s
}

// Run serves the CSI endpoint until ctx ends.
func (d *Driver) Run(ctx context.Context) error {
	l, err := Listen(d.cfg.Endpoint)
	if err != nil {
		return err
	}
	s := d.Server()
	if d.node != nil {
		go d.node.keepTLS(ctx, 30*time.Second)
	}
	go func() {
		<-ctx.Done()
		s.GracefulStop()
	}()
	slog.Info("CSI driver serving", "driver", DriverName, "endpoint", d.cfg.Endpoint, "mgmt", d.cfg.MgmtAddr)
	return s.Serve(l)
}

// Probe checks the management service (and, on a node, the node service's prerequisites).
func (d *Driver) Probe(ctx context.Context) error {
	if err := d.Live(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := d.ms.SystemQuery(ctx, &mgmtpb.SystemQueryReq{}); err != nil {
		return fmt.Errorf("management service %s: %s", d.cfg.MgmtAddr, status.Convert(err).Message())
	}
	return nil
}

// Live checks what the driver itself needs (the liveness endpoint): not the store, whose
// absence (not yet created, an outage) a restart of the plugin would not cure.
func (d *Driver) Live(ctx context.Context) error {
	if d.node != nil {
		return d.node.Probe(ctx)
	}
	return nil
}

// logCalls logs every call that fails, and the mutating ones that succeed, with its duration.
func logCalls(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	method := info.FullMethod[strings.LastIndex(info.FullMethod, "/")+1:]
	switch {
	case err != nil:
		slog.Warn("CSI call failed", "method", method, "code", status.Code(err), "error", status.Convert(err).Message(), "took", time.Since(start))
	case !strings.HasPrefix(method, "Get") && !strings.HasPrefix(method, "List") && method != "Probe" && !strings.HasSuffix(method, "Capabilities"):
		slog.Info("CSI call", "method", method, "took", time.Since(start))
	}
	return resp, err
}

// IdentityServer is the CSI identity service.
type IdentityServer struct {
	csipb.UnimplementedIdentityServer
	d *Driver
}

func (s *IdentityServer) GetPluginInfo(context.Context, *csipb.GetPluginInfoRequest) (*csipb.GetPluginInfoResponse, error) {
	v := s.d.cfg.Version
	if v == "" {
		v = "dev"
	}
	return &csipb.GetPluginInfoResponse{Name: DriverName, VendorVersion: v}, nil
}

func (s *IdentityServer) GetPluginCapabilities(context.Context, *csipb.GetPluginCapabilitiesRequest) (*csipb.GetPluginCapabilitiesResponse, error) {
	svc := func(t csipb.PluginCapability_Service_Type) *csipb.PluginCapability {
		return &csipb.PluginCapability{Type: &csipb.PluginCapability_Service_{Service: &csipb.PluginCapability_Service{Type: t}}}
	}
	caps := []*csipb.PluginCapability{
		svc(csipb.PluginCapability_Service_VOLUME_ACCESSIBILITY_CONSTRAINTS),
		{Type: &csipb.PluginCapability_VolumeExpansion_{VolumeExpansion: &csipb.PluginCapability_VolumeExpansion{
			Type: csipb.PluginCapability_VolumeExpansion_ONLINE}}},
	}
	if s.d.cfg.Mode != ModeNode {
		caps = append(caps, svc(csipb.PluginCapability_Service_CONTROLLER_SERVICE))
	}
	return &csipb.GetPluginCapabilitiesResponse{Capabilities: caps}, nil
}

// Probe answers ready only when the management service answers: a driver that cannot reach
// the store cannot do anything the CO asks. Not ready is an answer, not an error: the sidecars
// then wait (the store may not exist yet when the driver is installed).
func (s *IdentityServer) Probe(ctx context.Context, _ *csipb.ProbeRequest) (*csipb.ProbeResponse, error) {
	if err := s.d.Live(ctx); err != nil {
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err := s.d.Probe(ctx); err != nil {
		slog.Warn("CSI probe: not ready", "error", err)
		return &csipb.ProbeResponse{Ready: wrapperspb.Bool(false)}, nil
	}
	return &csipb.ProbeResponse{Ready: wrapperspb.Bool(true)}, nil
}
