// Package e2e holds the end-to-end suites: they run against any cluster named by KUBECONFIG on
// which Peregrine is installed (hack/cluster.sh and `make e2e` bring one up offline on this
// machine; the same suites run on kind). They create a ServerSet, a Pool, StorageClasses, PVCs
// and pods, and check what users see.
package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

var (
	cfg *rest.Config
	k8s client.Client
	cs  *kubernetes.Clientset
	// ns is the namespace of this run's objects.
	ns string
	// toolsImage runs the workload pods: any image with sh and coreutils (dd, sha256sum).
	toolsImage = envOr("E2E_TOOLS_IMAGE", "docker.io/library/debian:bookworm-slim")
	// engineImage is the ServerSet's engine image.
	engineImage = envOr("E2E_ENGINE_IMAGE", "peregrine/engine:dev")
	// The Helm release under test (hack/demo.sh and the kind workflow install it).
	release   = envOr("E2E_RELEASE", "peregrine")
	releaseNS = envOr("E2E_RELEASE_NAMESPACE", "peregrine-system")
)

func envOr(k, d string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return d
}

func TestE2E(t *testing.T) {
	if os.Getenv("KUBECONFIG") == "" {
		t.Skip("KUBECONFIG names no cluster: bring one up with `bash hack/cluster.sh up` (or use kind) and install Peregrine; `make e2e` does both")
	}
	RegisterFailHandler(Fail)
	RunSpecs(t, "Peregrine end-to-end")
}

var _ = BeforeSuite(func() {
	var err error
	cfg, err = clientcmd.BuildConfigFromFlags("", os.Getenv("KUBECONFIG"))
	Expect(err).NotTo(HaveOccurred())
	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(storagev1.AddToScheme(scheme)).To(Succeed())
	k8s, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())
	cs, err = kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	ns = envOr("E2E_NAMESPACE", "peregrine-e2e")
	err = k8s.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	if err != nil {
		Expect(client.IgnoreAlreadyExists(err)).To(Succeed())
	}
	SetDefaultEventuallyTimeout(5 * time.Minute)
	SetDefaultEventuallyPollingInterval(2 * time.Second)
})
