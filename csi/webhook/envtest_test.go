package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	crwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// The envtest suites run a real etcd and kube-apiserver (KUBEBUILDER_ASSETS; by default the
// directory hack/build-kube.sh fills, as hack/go.mk names it) and let the API server call the
// webhook over TLS, configured by config/webhook/manifests.yaml.

const manifestPath = "../../config/webhook/manifests.yaml"

func kubebuilderAssets(t *testing.T) {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		t.Setenv("KUBEBUILDER_ASSETS", filepath.Join(cache, "peregrine", "kube-v1.35.4", "bin"))
	}
	dir := os.Getenv("KUBEBUILDER_ASSETS")
	if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
		t.Fatalf("KUBEBUILDER_ASSETS=%s has no kube-apiserver (make kube-bin builds it): %v", dir, err)
	}
}

func testScheme(t *testing.T) *runtime.Scheme {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return scheme
}

// loadManifest reads the MutatingWebhookConfiguration of config/webhook.
func loadManifest(t *testing.T) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	f, err := os.Open(manifestPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mwc := &admissionregistrationv1.MutatingWebhookConfiguration{}
	if err := utilyaml.NewYAMLOrJSONDecoder(f, 4096).Decode(mwc); err != nil {
		t.Fatal(err)
	}
	return mwc
}

func startEnv(t *testing.T, env *envtest.Environment) client.Client {
	t.Helper()
	kubebuilderAssets(t)
	ctrl.SetLogger(testLogger())
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("envtest stop: %v", err)
		}
	})
	c, err := client.New(cfg, client.Options{Scheme: testScheme(t)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testLogger: the operator's log on stderr with PEREGRINE_TEST_VERBOSE set, else discarded.
func testLogger() logr.Logger {
	if os.Getenv("PEREGRINE_TEST_VERBOSE") != "" {
		return zap.New(zap.UseDevMode(true), zap.WriteTo(os.Stderr))
	}
	return logr.Discard()
}

func newPod(ns, name string, annotations map[string]string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func createNamespace(t *testing.T, c client.Client, name string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(context.Background(), ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// create creates pod in the API server and returns what was stored.
func create(t *testing.T, c client.Client, pod *corev1.Pod) *corev1.Pod {
	t.Helper()
	if err := c.Create(context.Background(), pod); err != nil {
		t.Fatalf("create pod %s: %v", pod.Name, err)
	}
	got := &corev1.Pod{}
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(pod), got); err != nil {
		t.Fatal(err)
	}
	return got
}

// intercepted reports whether a dry-run create of an annotated pod comes back patched, that is,
// whether the API server currently calls the webhook successfully.
func intercepted(ctx context.Context, c client.Client, ns string) (bool, error) {
	pod := newPod(ns, "probe", map[string]string{AnnotationIntercept: "true"}, ctr("a"))
	if err := c.Create(ctx, pod, client.DryRunAll); err != nil {
		return false, err
	}
	_, n := envValue(pod.Spec.Containers[0], "LD_PRELOAD")
	return n == 1, nil
}

func waitIntercepted(t *testing.T, c client.Client, ns string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, err := intercepted(context.Background(), c, ns)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server did not get the pod patched within %v (last error %v)", timeout, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestWebhookEnvtest: the manifest installed by envtest.WebhookInstallOptions (envtest's own
// serving certificate), the handler in controller-runtime's webhook server, pods created in a real
// API server.
func TestWebhookEnvtest(t *testing.T) {
	env := &envtest.Environment{
		WebhookInstallOptions: envtest.WebhookInstallOptions{Paths: []string{manifestPath}},
	}
	c := startEnv(t, env)
	wio := &env.WebhookInstallOptions

	var calls atomic.Int64
	handler := NewPodInterceptor(testScheme(t), "")
	srv := crwebhook.NewServer(crwebhook.Options{Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir})
	srv.Register(MutatePath, &admission.Webhook{Handler: admission.HandlerFunc(func(ctx context.Context, req admission.Request) admission.Response {
		calls.Add(1)
		return handler.Handle(ctx, req)
	})})
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Start(ctx) }()
	t.Cleanup(stop)

	ns := "apps"
	createNamespace(t, c, ns)
	waitIntercepted(t, c, ns, 30*time.Second)

	t.Run("two containers", func(t *testing.T) {
		before := calls.Load()
		pod := newPod(ns, "two", map[string]string{AnnotationIntercept: "true"}, ctr("a"), ctr("b"))
		pod.Spec.InitContainers = []corev1.Container{ctr("init")}
		got := create(t, c, pod)
		assertVolume(t, got, DefaultHostDir)
		assertPatched(t, got.Spec.Containers[0], LibraryPath)
		assertPatched(t, got.Spec.Containers[1], LibraryPath)
		assertUntouched(t, got.Spec.InitContainers[0])
		if calls.Load() == before {
			t.Error("the webhook was not called")
		}
	})

	t.Run("opt out", func(t *testing.T) {
		got := create(t, c, newPod(ns, "optout", map[string]string{AnnotationIntercept: "true", AnnotationInterceptExclude: "sidecar"}, ctr("app"), ctr("sidecar")))
		assertVolume(t, got, DefaultHostDir)
		assertPatched(t, got.Spec.Containers[0], LibraryPath)
		assertUntouched(t, got.Spec.Containers[1])
	})

	t.Run("plain pods untouched", func(t *testing.T) {
		before := calls.Load()
		for name, ann := range map[string]map[string]string{"plain": nil, "false": {AnnotationIntercept: "false"}, "yes": {AnnotationIntercept: "yes"}} {
			got := create(t, c, newPod(ns, name, ann, ctr("a")))
			assertUntouched(t, got.Spec.Containers[0])
			if len(got.Spec.Volumes) != 0 || got.Spec.Containers[0].Env != nil {
				t.Errorf("%s: pod changed: %+v", name, got.Spec)
			}
		}
		// The matchCondition keeps them from reaching the webhook at all.
		if n := calls.Load() - before; n != 0 {
			t.Errorf("the webhook was called %d times for pods that did not ask", n)
		}
	})

	t.Run("existing LD_PRELOAD and report", func(t *testing.T) {
		got := create(t, c, newPod(ns, "preload", map[string]string{AnnotationIntercept: "true", AnnotationInterceptReport: "true"},
			ctr("a", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libfoo.so"}),
			ctr("b", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libfoo.so:" + LibraryPath})))
		assertPatched(t, got.Spec.Containers[0], "/usr/lib/libfoo.so:"+LibraryPath)
		assertPatched(t, got.Spec.Containers[1], "/usr/lib/libfoo.so:"+LibraryPath)
		for _, ctr := range got.Spec.Containers {
			if v, n := envValue(ctr, "PEREGRINE_IL_REPORT"); n != 1 || v != "1" {
				t.Errorf("container %s: PEREGRINE_IL_REPORT %q (%d)", ctr.Name, v, n)
			}
		}
	})

	t.Run("already patched", func(t *testing.T) {
		before := calls.Load()
		pod := newPod(ns, "patched", map[string]string{AnnotationIntercept: "true"}, ctr("a"))
		Mutator{}.Mutate(pod)
		want := pod.DeepCopy()
		got := create(t, c, pod)
		assertVolume(t, got, DefaultHostDir)
		assertPatched(t, got.Spec.Containers[0], LibraryPath)
		if len(got.Spec.Containers[0].Env) != len(want.Spec.Containers[0].Env) || len(got.Spec.Containers[0].VolumeMounts) != len(want.Spec.Containers[0].VolumeMounts) {
			t.Errorf("patched twice: %+v", got.Spec.Containers[0])
		}
		if calls.Load() == before {
			t.Error("the webhook was not called")
		}
	})

	// Last: the webhook down. failurePolicy Ignore lets the annotated pod through, unpatched.
	t.Run("outage does not block pods", func(t *testing.T) {
		stop()
		select {
		case err := <-served:
			if err != nil {
				t.Fatalf("webhook server: %v", err)
			}
		case <-time.After(70 * time.Second):
			t.Fatal("webhook server did not stop")
		}
		got := create(t, c, newPod(ns, "outage", map[string]string{AnnotationIntercept: "true"}, ctr("a")))
		assertUntouched(t, got.Spec.Containers[0])
	})
}

// hostIP is an IPv4 address of this machine other than loopback: the API server only routes to
// Service endpoints that are not loopback addresses.
func hostIP() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

func freePort(t *testing.T, host string) int {
	t.Helper()
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// servedCert dials the webhook server as the API server does (ServerName the service's name,
// trusting bundle) and returns the certificate it presents.
func servedCert(addr string, bundle []byte) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return nil, errors.New("empty bundle")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{
		ServerName: "peregrine-webhook.peregrine-system.svc", RootCAs: roots,
	})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// TestWebhookOperatorCert: the operator's own wiring (Setup in a manager), its certificate and
// caBundle, and the manifest as deployed: the API server reaches the webhook through the Service
// peregrine-system/peregrine-webhook (endpoint routing to this machine) and verifies the serving
// certificate for peregrine-webhook.peregrine-system.svc against the caBundle the rotator set.
// Then the certificate is renewed by time, the CA is renewed, the Secret is lost, and each time the
// API server keeps calling the webhook.
func TestWebhookOperatorCert(t *testing.T) {
	ip := hostIP()
	if ip == "" {
		t.Skip("no non-loopback IPv4 address: the API server will not route a Service to loopback")
	}
	env := &envtest.Environment{}
	// Route to the Service's endpoints (as a cluster without kube-proxy on the control plane does)
	// instead of resolving peregrine-webhook.peregrine-system.svc through DNS.
	env.ControlPlane.GetAPIServer().Configure().Set("enable-aggregator-routing", "true")
	c := startEnv(t, env)
	ctx := context.Background()

	const ns = "peregrine-system"
	createNamespace(t, c, ns)
	createNamespace(t, c, "apps")
	port := freePort(t, ip)
	// The webhook configuration exactly as config/webhook has it (service reference, no caBundle).
	mwc := loadManifest(t)
	if mwc.Webhooks[0].ClientConfig.Service == nil || len(mwc.Webhooks[0].ClientConfig.CABundle) != 0 {
		t.Fatalf("manifest clientConfig: %+v", mwc.Webhooks[0].ClientConfig)
	}
	if err := c.Create(ctx, mwc); err != nil {
		t.Fatal(err)
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peregrine-webhook"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{
			Name: "https", Port: 443, TargetPort: intstr.FromInt32(int32(port)), Protocol: corev1.ProtocolTCP,
		}}},
	}
	if err := c.Create(ctx, svc); err != nil {
		t.Fatal(err)
	}
	// No endpoint controller runs in envtest: publish this machine as the Service's endpoint.
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peregrine-webhook-test", Labels: map[string]string{
			discoveryv1.LabelServiceName: "peregrine-webhook", discoveryv1.LabelManagedBy: "webhook-test",
		}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   []discoveryv1.Endpoint{{Addresses: []string{ip}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}},
		Ports:       []discoveryv1.EndpointPort{{Name: ptr.To("https"), Port: ptr.To(int32(port)), Protocol: ptr.To(corev1.ProtocolTCP)}},
	}
	if err := c.Create(ctx, slice); err != nil {
		t.Fatal(err)
	}
	// Endpoints too, for API servers that still resolve through them.
	eps := &corev1.Endpoints{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "peregrine-webhook"},
		Subsets: []corev1.EndpointSubset{{
			Addresses: []corev1.EndpointAddress{{IP: ip}},
			Ports:     []corev1.EndpointPort{{Name: "https", Port: int32(port), Protocol: corev1.ProtocolTCP}},
		}},
	}
	if err := c.Create(ctx, eps); err != nil {
		t.Fatal(err)
	}

	// The operator: a manager with the webhook set up as cmd/operator does it. Certificates live
	// 45 seconds here, so one renewal by time happens during the test.
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: testScheme(t), Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
	})
	if err != nil {
		t.Fatal(err)
	}
	certDir := t.TempDir()
	rot, err := Setup(mgr, Options{Host: ip, Port: port, Certs: CertOptions{
		Namespace: ns, ServiceName: "peregrine-webhook", WebhookConfigName: mwc.Name, CertDir: certDir,
		CertLifetime: 45 * time.Second, CheckInterval: 500 * time.Millisecond,
	}})
	if err != nil {
		t.Fatal(err)
	}
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	select {
	case <-rot.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("no certificate written within 30s")
	}
	addr := net.JoinHostPort(ip, strconv.Itoa(port))
	secretKey := types.NamespacedName{Namespace: ns, Name: DefaultSecretName}
	secret := func() *corev1.Secret {
		s := &corev1.Secret{}
		if err := c.Get(ctx, secretKey, s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	caBundle := func() []byte {
		m := &admissionregistrationv1.MutatingWebhookConfiguration{}
		if err := c.Get(ctx, types.NamespacedName{Name: mwc.Name}, m); err != nil {
			t.Fatal(err)
		}
		return m.Webhooks[0].ClientConfig.CABundle
	}
	// serving waits until the caBundle is the Secret's ca.crt and the server presents the Secret's
	// certificate, verified for the service's name against that caBundle, and returns the
	// certificate. It follows the Secret (certificates renew every 30 seconds here).
	serving := func(t *testing.T) *x509.Certificate {
		t.Helper()
		var got *x509.Certificate
		eventually(t, 30*time.Second, "the server to present the Secret's certificate", func() bool {
			s := &corev1.Secret{}
			if err := c.Get(ctx, secretKey, s); err != nil {
				return false
			}
			bundle := caBundle()
			if !bytes.Equal(bundle, s.Data["ca.crt"]) {
				return false
			}
			cert, err := servedCert(addr, bundle)
			got = cert
			return err == nil && cert.Equal(parseCerts(s.Data["tls.crt"])[0])
		})
		return got
	}
	// podPatched: one real create of an annotated pod comes back patched.
	n := 0
	podPatched := func(t *testing.T) {
		t.Helper()
		n++
		got := create(t, c, newPod("apps", fmt.Sprintf("p%d", n), map[string]string{AnnotationIntercept: "true"}, ctr("a"), ctr("b")))
		assertVolume(t, got, DefaultHostDir)
		assertPatched(t, got.Spec.Containers[0], LibraryPath)
		assertPatched(t, got.Spec.Containers[1], LibraryPath)
	}

	var first *corev1.Secret
	t.Run("operator certificate trusted", func(t *testing.T) {
		first = secret()
		verifyServing(t, first.Data["tls.crt"], first.Data["tls.key"], first.Data["ca.crt"])
		serving(t)
		waitIntercepted(t, c, "apps", 30*time.Second)
		podPatched(t)
	})

	t.Run("second replica agrees", func(t *testing.T) {
		s := secret()
		other := t.TempDir()
		r2, err := NewCertRotator(c, CertOptions{Namespace: ns, ServiceName: "peregrine-webhook", WebhookConfigName: mwc.Name, CertDir: other, CertLifetime: 45 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := r2.Check(ctx); err != nil {
			t.Fatal(err)
		}
		// Unless the first replica renewed in between, the Secret is unchanged and the files equal it.
		now := secret()
		b, _ := os.ReadFile(filepath.Join(other, "tls.crt"))
		if !bytes.Equal(b, now.Data["tls.crt"]) && !bytes.Equal(b, s.Data["tls.crt"]) {
			t.Error("second replica's certificate is not the Secret's")
		}
	})

	t.Run("renewed with a third of its life left", func(t *testing.T) {
		// The 45-second certificate is renewed once less than 15 seconds remain (after about 30s).
		var renewed *corev1.Secret
		eventually(t, 45*time.Second, "the certificate to be renewed", func() bool {
			renewed = secret()
			return !bytes.Equal(renewed.Data["tls.crt"], first.Data["tls.crt"])
		})
		old := parseCerts(first.Data["tls.crt"])[0]
		if left := time.Until(old.NotAfter); left > 16*time.Second || left < 0 {
			t.Errorf("renewed with %v left, want under a third of 45s", left)
		}
		if !bytes.Equal(renewed.Data["ca.crt"], first.Data["ca.crt"]) {
			t.Error("the CA changed on a serving certificate renewal")
		}
		cert := serving(t) // the file watcher picked up the new pair
		if cert.Equal(old) {
			t.Error("still serving the old certificate")
		}
		// Same CA, so no waiting for the API server: the next pod is patched.
		podPatched(t)
	})

	t.Run("CA close to expiry", func(t *testing.T) {
		now := time.Now()
		oldCA, oldKey, err := newCA(now.Add(-9*24*time.Hour), 10*24*time.Hour) // a day of ten left
		if err != nil {
			t.Fatal(err)
		}
		oldKeyPEM, _ := pemKey(oldKey)
		certPEM, keyPEM, _ := newServingCert(oldCA, oldKey, (CertOptions{Namespace: ns, ServiceName: "peregrine-webhook"}).DNSNames(), now, time.Hour)
		for {
			s := secret()
			s.Data = map[string][]byte{"ca.crt": pemCert(oldCA.Raw), "ca.key": oldKeyPEM, "tls.crt": certPEM, "tls.key": keyPEM}
			err := c.Update(ctx, s)
			if err == nil {
				break
			}
			if !apierrors.IsConflict(err) {
				t.Fatal(err)
			}
		}
		var renewed *corev1.Secret
		eventually(t, 30*time.Second, "a new CA", func() bool {
			renewed = secret()
			cas := parseCerts(renewed.Data["ca.crt"])
			return len(cas) == 2 && !cas[0].Equal(oldCA) && cas[1].Equal(oldCA)
		})
		cert := serving(t) // caBundle updated to new + old CA, server presents the new pair
		newOnly := x509.NewCertPool()
		newOnly.AddCert(parseCerts(renewed.Data["ca.crt"])[0])
		if _, err := cert.Verify(x509.VerifyOptions{DNSName: "peregrine-webhook.peregrine-system.svc", Roots: newOnly}); err != nil {
			t.Errorf("served certificate not from the new CA: %v", err)
		}
		// The API server sees a new caBundle through its informer: give it a moment.
		waitIntercepted(t, c, "apps", 30*time.Second)
		podPatched(t)
	})

	t.Run("Secret lost", func(t *testing.T) {
		before := secret()
		if err := c.Delete(ctx, before); err != nil {
			t.Fatal(err)
		}
		var again *corev1.Secret
		eventually(t, 30*time.Second, "the Secret to be made again", func() bool {
			again = &corev1.Secret{}
			return c.Get(ctx, secretKey, again) == nil && again.UID != before.UID
		})
		if bytes.Equal(again.Data["ca.crt"], before.Data["ca.crt"]) {
			t.Error("same CA after the Secret was lost")
		}
		serving(t)
		waitIntercepted(t, c, "apps", 30*time.Second)
		podPatched(t)
	})
}
