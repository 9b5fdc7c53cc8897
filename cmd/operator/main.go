// Command operator runs the Peregrine operator: the ServerSet, Pool and Container reconcilers.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/controllers"
	ilwebhook "github.com/peregrine-storage/peregrine/csi/webhook"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// config is what the flags set.
type config struct {
	metricsAddr, probeAddr, metricsCertDir string
	leaderElect, metricsSecure             bool
	// leaderElectionNamespace is the Lease's namespace; empty: the pod's own (in a cluster).
	leaderElectionNamespace string
	refresh                 time.Duration
	policy                  controllers.EnginePolicy
	watchNamespaces         listFlag
	tls                     controllers.TLSOptions
	csiServerSet            string
	csiNodeRole             string
	webhookEnable           bool
	webhook                 ilwebhook.Options
	// skipNameValidation lets tests run several managers in one process (controller names are
	// otherwise unique per process).
	skipNameValidation bool
}

func (c *config) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8443", "address of the metrics endpoint (0 disables it)")
	fs.BoolVar(&c.metricsSecure, "metrics-secure", true,
		"serve metrics over HTTPS, to callers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the non-resource URL /metrics); false serves plain HTTP to anyone")
	fs.StringVar(&c.metricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the metrics endpoint (empty: a self-signed certificate made at start)")
	fs.StringVar(&c.probeAddr, "health-probe-bind-address", ":8081", "address of the health probes")
	fs.BoolVar(&c.leaderElect, "leader-elect", false, "elect one active operator among replicas (a Lease in the operator's namespace)")
	fs.StringVar(&c.leaderElectionNamespace, "leader-election-namespace", "", "namespace of the leader election Lease (empty: the operator pod's)")
	fs.DurationVar(&c.refresh, "status-refresh", 30*time.Second, "how often status is re-read from the management service")
	c.policy = controllers.DefaultEnginePolicy()
	fs.Var((*listFlag)(&c.policy.AllowedImages), "allowed-images",
		"comma-separated prefixes a ServerSet's engine image must start with, each ending in '/' (a registry or path), ':' (a repository, any tag) or '@' (a repository, by digest)")
	fs.Var((*listFlag)(&c.policy.AllowedHostPaths), "allowed-host-paths",
		"comma-separated node directories a ServerSet's emulated storage hostPath must be, or be below")
	fs.Var((*listFlag)(&c.policy.AllowedDevices), "allowed-devices",
		"comma-separated prefixes a ServerSet's NVMe device path must start with (e.g. /dev/nvme)")
	fs.BoolVar(&c.policy.AllowInsecureControlPlane, "allow-insecure-control-plane", false,
		"let ServerSets ask for spec.insecureControlPlane: engines serving their gRPC API without TLS (logged as a warning); off: such ServerSets are refused")
	fs.DurationVar(&c.tls.CALifetime, "ca-lifetime", controllers.DefaultCALifetime, "validity of a new CA of a ServerSet (rotated two thirds in)")
	fs.DurationVar(&c.tls.CertLifetime, "cert-lifetime", controllers.DefaultCertLifetime, "validity of the engines' and the CSI driver's certificates (renewed two thirds in)")
	fs.DurationVar(&c.tls.StageDwell, "ca-rotation-dwell", controllers.DefaultStageDwell,
		"least time between the steps of a CA rotation, beyond the engines' restart (mounted Secrets reach running pods within the kubelet's sync period)")
	fs.StringVar(&c.tls.CSINamespace, "csi-tls-namespace", "", "namespace of the CSI driver's certificate Secrets ("+controllers.CSIControllerSecret+", "+controllers.CSINodeSecret+"); empty: none issued")
	fs.StringVar(&c.csiNodeRole, "csi-node-role", "client", "role of the CSI node plugin's certificate: client (mounts only) or admin (inline ephemeral volumes: the plugin creates their containers)")
	fs.StringVar(&c.csiServerSet, "csi-serverset", "", "NAMESPACE/NAME of the ServerSet whose system the CSI driver serves (its certificates are for that system)")
	fs.Var(&c.watchNamespaces, "watch-namespaces",
		"comma-separated namespaces whose ServerSets, Pools and Containers the operator reconciles (empty: all; its RBAC can then be Roles in these namespaces)")
	wh := &c.webhook
	fs.BoolVar(&c.webhookEnable, "webhook-enable", false, "serve the admission webhook that preloads the interception library, and keep its certificate")
	fs.IntVar(&wh.Port, "webhook-port", ilwebhook.DefaultPort, "port of the webhook server")
	fs.StringVar(&wh.Certs.CertDir, "webhook-cert-dir", ilwebhook.DefaultCertDir, "directory the operator writes the webhook's certificate into")
	fs.StringVar(&wh.Certs.Namespace, "webhook-namespace", ilwebhook.DefaultNamespace, "namespace of the webhook Service and its certificate Secret")
	fs.StringVar(&wh.Certs.ServiceName, "webhook-service", ilwebhook.DefaultServiceName, "the webhook Service (the certificate is for SERVICE.NAMESPACE.svc)")
	fs.StringVar(&wh.Certs.SecretName, "webhook-secret", ilwebhook.DefaultSecretName, "Secret holding the webhook's CA and certificate")
	fs.StringVar(&wh.Certs.WebhookConfigName, "webhook-config-name", ilwebhook.DefaultWebhookConfigName, "MutatingWebhookConfiguration whose caBundle the operator sets")
	fs.DurationVar(&wh.Certs.CertLifetime, "webhook-cert-lifetime", ilwebhook.DefaultCertLifetime, "validity of a new webhook certificate (renewed with a third left)")
	fs.DurationVar(&wh.Certs.CheckInterval, "webhook-cert-check-interval", ilwebhook.DefaultCheckInterval, "how often the webhook certificate is checked")
	fs.StringVar(&wh.HostDir, "il-host-dir", ilwebhook.DefaultHostDir, "node directory holding libperegrine_il.so (the CSI node plugin's)")
}

func main() {
	var c config
	c.bindFlags(flag.CommandLine)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("operator")

	mgr, err := newManager(ctrl.GetConfigOrDie(), &c)
	if err != nil {
		log.Error(err, "cannot set up the operator")
		os.Exit(1)
	}
	log.Info("starting", "allowedImages", c.policy.AllowedImages, "allowedHostPaths", c.policy.AllowedHostPaths,
		"allowedDevices", c.policy.AllowedDevices, "watchNamespaces", []string(c.watchNamespaces), "metricsSecure", c.metricsSecure)
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}

// newManager makes the operator's manager from the flags: the reconcilers, the webhook, the
// probes, and the metrics endpoint (HTTPS behind authentication and authorization unless
// --metrics-secure=false).
func newManager(cfg *rest.Config, c *config) (ctrl.Manager, error) {
	if err := c.policy.Validate(); err != nil {
		return nil, fmt.Errorf("engine policy flags: %w", err)
	}
	if c.csiServerSet != "" {
		ns, name, ok := strings.Cut(c.csiServerSet, "/")
		if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf("--csi-serverset %q: want NAMESPACE/NAME", c.csiServerSet)
		}
		c.tls.CSIServerSet = types.NamespacedName{Namespace: ns, Name: name}
		if c.tls.CSINamespace == "" {
			return nil, errors.New("--csi-serverset needs --csi-tls-namespace (where the CSI driver's Secrets go)")
		}
	}
	switch r := pki.Role(c.csiNodeRole); r {
	case pki.RoleClient, pki.RoleAdmin:
		c.tls.CSINodeRole = r
	default:
		return nil, fmt.Errorf("--csi-node-role %q: want client or admin", c.csiNodeRole)
	}
	if c.policy.AllowInsecureControlPlane {
		ctrl.Log.WithName("operator").Info("WARNING: --allow-insecure-control-plane: ServerSets may run their engines' gRPC API without TLS (spec.insecureControlPlane)")
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(storagev1.AddToScheme(scheme))

	metrics := metricsserver.Options{BindAddress: c.metricsAddr, SecureServing: c.metricsSecure, CertDir: c.metricsCertDir}
	if c.metricsSecure {
		// controller-runtime's filter: a bearer token checked with a TokenReview, then a
		// SubjectAccessReview of "get" on the non-resource URL /metrics (the ClusterRole
		// peregrine-metrics-reader grants it).
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	var cacheOpts cache.Options
	if len(c.watchNamespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range c.watchNamespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                  scheme,
		Metrics:                 metrics,
		Cache:                   cacheOpts,
		HealthProbeBindAddress:  c.probeAddr,
		LeaderElection:          c.leaderElect,
		LeaderElectionID:        "operator.storage.peregrine.dev",
		LeaderElectionNamespace: c.leaderElectionNamespace,
		Controller:              ctrlconfig.Controller{SkipNameValidation: &c.skipNameValidation},
	})
	if err != nil {
		return nil, fmt.Errorf("manager: %w", err)
	}
	if err := controllers.Setup(mgr, c.refresh, c.policy, c.tls); err != nil {
		return nil, fmt.Errorf("reconcilers: %w", err)
	}
	if c.webhookEnable {
		if _, err := ilwebhook.Setup(mgr, c.webhook); err != nil {
			return nil, fmt.Errorf("webhook: %w", err)
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return nil, err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return nil, err
	}
	return mgr, nil
}

// listFlag is a comma-separated list flag; setting it replaces the default, and an empty value
// gives an empty list.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	*l = nil
	for _, e := range strings.Split(v, ",") {
		if e = strings.TrimSpace(e); e != "" {
			*l = append(*l, e)
		}
	}
	return nil
}
