package webhook

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// Defaults of Options, matching config/webhook.
const (
	DefaultPort              = 9443
	DefaultNamespace         = "peregrine-system"
	DefaultServiceName       = "peregrine-webhook"
	DefaultWebhookConfigName = "peregrine-webhook"
)

// DefaultCertDir is controller-runtime's default webhook certificate directory.
var DefaultCertDir = filepath.Join(os.TempDir(), "k8s-webhook-server", "serving-certs")

// Options configure the webhook server and its certificate.
type Options struct {
	// Host and Port the webhook server listens on (all addresses, DefaultPort when zero).
	Host string
	Port int
	// HostDir is the node directory with libperegrine_il.so (DefaultHostDir when empty).
	HostDir string
	// Certs configure the certificate; Certs.CertDir defaults to DefaultCertDir.
	Certs CertOptions
}

// Setup adds the webhook to mgr: the certificate rotator, and the webhook server serving the pod
// mutation at MutatePath, started only once the rotator has written the first certificate (the
// server reads its certificate when it starts and fails without one; manager-registered webhook
// servers start before every other runnable, so this server is not the manager's own). It also adds
// a readiness check "webhook" that passes once the server accepts TLS connections, so the Service
// sends requests only to replicas that serve.
func Setup(mgr manager.Manager, o Options) (*CertRotator, error) {
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.Certs.CertDir == "" {
		o.Certs.CertDir = DefaultCertDir
	}
	// A client without a cache: the rotator reads one Secret and one webhook configuration, and a
	// cache would list and watch every Secret in the cluster.
	c, err := client.New(mgr.GetConfig(), client.Options{
		Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper(), HTTPClient: mgr.GetHTTPClient(),
	})
	if err != nil {
		return nil, fmt.Errorf("webhook: client: %w", err)
	}
	rot, err := NewCertRotator(c, o.Certs)
	if err != nil {
		return nil, err
	}
	srv := crwebhook.NewServer(crwebhook.Options{Host: o.Host, Port: o.Port, CertDir: o.Certs.CertDir})
	srv.Register(MutatePath, &admission.Webhook{Handler: NewPodInterceptor(mgr.GetScheme(), o.HostDir)})
	if err := mgr.Add(rot); err != nil {
		return nil, err
	}
	if err := mgr.Add(&gatedServer{srv: srv, ready: rot.Ready()}); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("webhook", srv.StartedChecker()); err != nil {
		return nil, err
	}
	return rot, nil
}

// gatedServer starts the webhook server once ready is closed. It is a plain Runnable (not a
// webhook.Server), so the manager starts it with the other non-leader runnables.
type gatedServer struct {
	srv   crwebhook.Server
	ready <-chan struct{}
}

func (g *gatedServer) Start(ctx context.Context) error {
	select {
	case <-g.ready:
	case <-ctx.Done():
		return nil
	}
	return g.srv.Start(ctx)
}

func (g *gatedServer) NeedLeaderElection() bool { return false }
