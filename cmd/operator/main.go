// Command operator runs the Peregrine operator: the ServerSet, Pool and Container reconcilers.
package main

import (
	"flag"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/controllers"
	ilwebhook "github.com/peregrine-storage/peregrine/csi/webhook"
)

func main() {
	var metricsAddr, probeAddr, metricsCertDir string
	var leaderElect, metricsSecure bool
	var refresh time.Duration
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8443", "address of the metrics endpoint (0 disables it)")
	flag.BoolVar(&metricsSecure, "metrics-secure", true,
		"serve metrics over HTTPS, to callers the API server authenticates (TokenReview) and authorizes (SubjectAccessReview: get on the non-resource URL /metrics); false serves plain HTTP to anyone")
	flag.StringVar(&metricsCertDir, "metrics-cert-dir", "", "directory with tls.crt and tls.key for the metrics endpoint (empty: a self-signed certificate made at start)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of the health probes")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect one active operator among replicas (a Lease in the operator's namespace)")
	flag.DurationVar(&refresh, "status-refresh", 30*time.Second, "how often status is re-read from the management service")
	policy := controllers.DefaultEnginePolicy()
	flag.Var((*listFlag)(&policy.AllowedImages), "allowed-images",
		"comma-separated prefixes a ServerSet's engine image must start with, each ending in '/' (a registry or path), ':' (a repository, any tag) or '@' (a repository, by digest)")
	flag.Var((*listFlag)(&policy.AllowedHostPaths), "allowed-host-paths",
		"comma-separated node directories a ServerSet's emulated storage hostPath must be, or be below")
	flag.Var((*listFlag)(&policy.AllowedDevices), "allowed-devices",
		"comma-separated prefixes a ServerSet's NVMe device path must start with (e.g. /dev/nvme)")
	var watchNamespaces listFlag
	flag.Var(&watchNamespaces, "watch-namespaces",
		"comma-separated namespaces whose ServerSets, Pools and Containers the operator reconciles (empty: all; its RBAC can then be Roles in these namespaces)")
	var wh ilwebhook.Options
	var webhookEnable bool
	flag.BoolVar(&webhookEnable, "webhook-enable", false, "serve the admission webhook that preloads the interception library, and keep its certificate")
	flag.IntVar(&wh.Port, "webhook-port", ilwebhook.DefaultPort, "port of the webhook server")
	flag.StringVar(&wh.Certs.CertDir, "webhook-cert-dir", ilwebhook.DefaultCertDir, "directory the operator writes the webhook's certificate into")
	flag.StringVar(&wh.Certs.Namespace, "webhook-namespace", ilwebhook.DefaultNamespace, "namespace of the webhook Service and its certificate Secret")
	flag.StringVar(&wh.Certs.ServiceName, "webhook-service", ilwebhook.DefaultServiceName, "the webhook Service (the certificate is for SERVICE.NAMESPACE.svc)")
	flag.StringVar(&wh.Certs.SecretName, "webhook-secret", ilwebhook.DefaultSecretName, "Secret holding the webhook's CA and certificate")
	flag.StringVar(&wh.Certs.WebhookConfigName, "webhook-config-name", ilwebhook.DefaultWebhookConfigName, "MutatingWebhookConfiguration whose caBundle the operator sets")
	flag.DurationVar(&wh.Certs.CertLifetime, "webhook-cert-lifetime", ilwebhook.DefaultCertLifetime, "validity of a new webhook certificate (renewed with a third left)")
	flag.DurationVar(&wh.Certs.CheckInterval, "webhook-cert-check-interval", ilwebhook.DefaultCheckInterval, "how often the webhook certificate is checked")
	flag.StringVar(&wh.HostDir, "il-host-dir", ilwebhook.DefaultHostDir, "node directory holding libperegrine_il.so (the CSI node plugin's)")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	log := ctrl.Log.WithName("operator")

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(storagev1.AddToScheme(scheme))

	if err := policy.Validate(); err != nil {
		log.Error(err, "bad engine policy flags")
		os.Exit(2)
	}
	metrics := metricsserver.Options{BindAddress: metricsAddr, SecureServing: metricsSecure, CertDir: metricsCertDir}
	if metricsSecure {
		// controller-runtime's filter: a bearer token checked with a TokenReview, then a
		// SubjectAccessReview of "get" on the non-resource URL /metrics (the ClusterRole
		// peregrine-metrics-reader grants it).
		metrics.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	var cacheOpts cache.Options
	if len(watchNamespaces) > 0 {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range watchNamespaces {
			cacheOpts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metrics,
		Cache:                  cacheOpts,
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "operator.storage.peregrine.dev",
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		os.Exit(1)
	}
	log.Info("engine policy", "allowedImages", policy.AllowedImages, "allowedHostPaths", policy.AllowedHostPaths,
		"allowedDevices", policy.AllowedDevices, "watchNamespaces", []string(watchNamespaces))
	if err := controllers.Setup(mgr, refresh, policy); err != nil {
		log.Error(err, "cannot set up the reconcilers")
		os.Exit(1)
	}
	if webhookEnable {
		if _, err := ilwebhook.Setup(mgr, wh); err != nil {
			log.Error(err, "cannot set up the webhook")
			os.Exit(1)
		}
	}
	utilruntime.Must(mgr.AddHealthzCheck("healthz", healthz.Ping))
	utilruntime.Must(mgr.AddReadyzCheck("readyz", healthz.Ping))
	log.Info("starting")
	if err := mgr.Start(ctrl.SetupSignalHandler()); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
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
