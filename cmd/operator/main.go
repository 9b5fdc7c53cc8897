// Command operator runs the Peregrine operator: the ServerSet, Pool and Container reconcilers.
package main

import (
	"flag"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/controllers"
	ilwebhook "github.com/peregrine-storage/peregrine/csi/webhook"
)

func main() {
	var metricsAddr, probeAddr string
	var leaderElect bool
	var refresh time.Duration
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "address of the metrics endpoint (0 disables it)")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "address of the health probes")
	flag.BoolVar(&leaderElect, "leader-elect", false, "elect one active operator among replicas")
	flag.DurationVar(&refresh, "status-refresh", 30*time.Second, "how often status is re-read from the management service")
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

	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		LeaderElection:         leaderElect,
		LeaderElectionID:       "operator.storage.peregrine.dev",
	})
	if err != nil {
		log.Error(err, "cannot create the manager")
		os.Exit(1)
	}
	if err := controllers.Setup(mgr, refresh); err != nil {
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
