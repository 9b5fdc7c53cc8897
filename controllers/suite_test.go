package controllers

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/internal/testengine"
)

// The suite runs the reconcilers against a real kube-apiserver and etcd (KUBEBUILDER_ASSETS, from
// hack/build-kube.sh) and real peregrine-engine processes (PEREGRINE_ENGINE_BIN, default
// engine/target/debug/peregrine-engine).
var (
	k8s       client.Client
	testEnv   *envtest.Environment
	ctx       context.Context
	cancel    context.CancelFunc
	engineBin string
	workDir   string
	// engineTLS: the engine binary does TLS on its control plane (testengine.KnowsTLS).
	engineTLS bool
)

func TestControllers(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controllers")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	ctx, cancel = context.WithCancel(context.Background())

	Expect(os.Getenv("KUBEBUILDER_ASSETS")).NotTo(BeEmpty(),
		"KUBEBUILDER_ASSETS must name a directory with etcd and kube-apiserver: KUBEBUILDER_ASSETS=$(hack/build-kube.sh)")
	engineBin = os.Getenv("PEREGRINE_ENGINE_BIN")
	if engineBin == "" {
		engineBin = filepath.Join("..", "engine", "target", "debug", "peregrine-engine")
	}
	_, err := os.Stat(engineBin)
	Expect(err).NotTo(HaveOccurred(), "engine binary: build it with `cd engine && cargo build -p peregrine-engine` or set PEREGRINE_ENGINE_BIN")
	workDir = GinkgoT().TempDir()

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(storagev1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	Expect(err).NotTo(HaveOccurred())
	// The operator's defaults, and the image names the suites use.
	policy := DefaultEnginePolicy()
	policy.AllowedImages = append(policy.AllowedImages, "peregrine:")
	// Engines built before TLS on the control plane run insecure ServerSets (newServerSet).
	engineTLS = testengine.KnowsTLS(engineBin)
	// ServerSets with spec.insecureControlPlane run (serverset_tls_test.go); the refusal without
	// the flag is the policy's (a unit spec there, and the chart's admission policy test).
	policy.AllowInsecureControlPlane = true
	GinkgoWriter.Printf("engine %s has TLS on its control plane: %t\n", engineBin, engineTLS)
	Expect(Setup(mgr, time.Second, policy, testTLSOptions)).To(Succeed())
	go func() {
		defer GinkgoRecover()
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	if cancel != nil {
		cancel()
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
	stopAllEngines()
})

// testTLSOptions: the CSI driver's certificates for the ServerSet "csi-tls" (serverset_tls_test.go).
// A CA rotation steps as soon as the (simulated) engines restarted.
var testTLSOptions = TLSOptions{CSINamespace: "csi-system", CSIServerSet: types.NamespacedName{Namespace: "default", Name: "csi-tls"},
	StageDwell: time.Second}
