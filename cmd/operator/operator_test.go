package main

// TestLeastPrivilege runs the operator as it is deployed, on a real kube-apiserver and etcd
// (envtest, with RBAC authorization): the objects of config/default (its ServiceAccount, ClusterRole,
// Roles, bindings, the admission policy) applied for real, the flags of its Deployment parsed by
// the operator's own flag set, and every request it makes sent as its ServiceAccount
// (impersonation). What it proves: config/rbac's rules suffice for leader election (the Lease),
// the webhook's certificate, rendering a ServerSet and writing its status, without any delete
// verb; the metrics endpoint is HTTPS and answers only callers the API server authenticates and
// allows to get /metrics; the admission policy refuses a ServerSet outside the operator's lists.

import (
	"bytes"
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/internal/kubetest"
)

const (
	opNamespace = "peregrine-system"
	opAccount   = "peregrine-operator"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// eventually retries f until it succeeds or the timeout passes, then fails with its last error.
func eventually(t *testing.T, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// startEnv runs envtest with the CRDs and returns its config and an admin client.
func startEnv(t *testing.T) (*rest.Config, client.Client) {
	t.Helper()
	ctrl.SetLogger(zap.New(zap.WriteTo(io.Discard)))
	env := &envtest.Environment{
		BinaryAssetsDirectory: kubetest.KubeAssets(t),
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := storagev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	admin, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cfg, admin
}

// asOperator is cfg with every request sent as the operator's ServiceAccount.
func asOperator(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.Impersonate = rest.ImpersonationConfig{
		UserName: "system:serviceaccount:" + opNamespace + ":" + opAccount,
		Groups:   []string{"system:serviceaccounts", "system:serviceaccounts:" + opNamespace, "system:authenticated"},
	}
	return c
}

// parseArgs parses a Deployment's operator flags with the operator's own flag set.
func parseArgs(t *testing.T, args []string) *config {
	t.Helper()
	var c config
	fs := flag.NewFlagSet("operator", flag.ContinueOnError)
	c.bindFlags(fs)
	fs.String("zap-log-level", "", "")
	if err := fs.Parse(args); err != nil {
		t.Fatalf("the Deployment's flags %q: %v", args, err)
	}
	c.skipNameValidation = true // one manager per test, several tests per process
	return &c
}

// start runs the manager until the test ends and waits until it leads.
func start(t *testing.T, ctx context.Context, mgr ctrl.Manager) {
	t.Helper()
	mctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("the manager did not stop")
		}
	})
	select {
	case <-mgr.Elected():
	case err := <-done:
		t.Fatalf("the manager stopped: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("not elected within 60 s: the Lease rule?")
	}
}

func newServerSet(ns, name string) *storagev1.ServerSet {
	return &storagev1.ServerSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns,
			Annotations: map[string]string{storagev1.AnnotationMgmtAddress: "127.0.0.1:1"}},
		Spec: storagev1.ServerSetSpec{Image: "peregrine/engine:dev", Engines: 1,
			Storage: storagev1.EngineStorage{Scm: "256MiB",
				Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine", Size: "1GiB"}}},
	}
}

// TestWatchNamespaces runs the operator with the chart's RBAC for operator.watchNamespaces (a
// Role in the watched namespace, a ClusterRole of cluster-scoped APIs only) and the flags the
// chart gives it: it reconciles ServerSets there, and leaves other namespaces alone.
func TestWatchNamespaces(t *testing.T) {
	cfg, admin := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, n := range []string{opNamespace, "tenant", "other"} {
		if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}); err != nil {
			t.Fatal(err)
		}
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command("bash", filepath.Join("..", "..", "hack", "build-helm.sh"))
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/build-helm.sh: %v\n%s", err, stderr.String())
	}
	helm := strings.TrimSpace(out.String())
	out.Reset()
	cmd = exec.Command(helm, "template", "peregrine", filepath.Join("..", "..", "charts", "peregrine"), "-n", opNamespace,
		"--set", "operator.watchNamespaces={tenant},webhook.enabled=false,csi.enabled=false,storageClass.enabled=false")
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	var args []string
	for _, o := range kubetest.Decode(t, "helm template", &out) {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := kubetest.Apply(ctx, admin, o, "test"); err != nil {
				t.Fatalf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
			}
		case "Deployment":
			args = kubetest.Typed[appsv1.Deployment](t, o).Spec.Template.Spec.Containers[0].Args
		}
	}
	c := parseArgs(t, args)
	if !slices.Equal(c.watchNamespaces, listFlag{"tenant"}) {
		t.Fatalf("--watch-namespaces %v", c.watchNamespaces)
	}
	c.metricsAddr, c.probeAddr, c.leaderElectionNamespace = "0", "0", opNamespace
	mgr, err := newManager(asOperator(cfg), c)
	if err != nil {
		t.Fatal(err)
	}
	start(t, ctx, mgr)

	in, out2 := newServerSet("tenant", "tank"), newServerSet("other", "tank")
	for _, ss := range []*storagev1.ServerSet{in, out2} {
		if err := admin.Create(ctx, ss); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "the StatefulSet in the watched namespace", func() error {
		return admin.Get(ctx, client.ObjectKeyFromObject(in), &appsv1.StatefulSet{})
	})
	eventually(t, 60*time.Second, "the status in the watched namespace", func() error {
		got := &storagev1.ServerSet{}
		if err := admin.Get(ctx, client.ObjectKeyFromObject(in), got); err != nil {
			return err
		}
		if meta.FindStatusCondition(got.Status.Conditions, storagev1.ConditionReady) == nil {
			return fmt.Errorf("no Ready condition yet")
		}
		return nil
	})
	time.Sleep(2 * time.Second)
	if err := admin.Get(ctx, client.ObjectKeyFromObject(out2), &appsv1.StatefulSet{}); err == nil {
		t.Error("a ServerSet outside --watch-namespaces was rendered")
	}
	// Nor is its status written (the operator's ServiceAccount could not: no Role there).
	if err := admin.Get(ctx, client.ObjectKeyFromObject(out2), out2); err != nil || len(out2.Status.Conditions) != 0 {
		t.Errorf("a ServerSet outside --watch-namespaces has status %v (%v)", out2.Status.Conditions, err)
	}
}

func TestLeastPrivilege(t *testing.T) {
	cfg, admin := startEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// config/default as `kubectl apply -k` applies it, less the Deployment (run here instead).
	var args []string
	for _, o := range kubetest.Kustomize(t, filepath.Join("..", "..", "config", "default")) {
		switch o.GetKind() {
		case "CustomResourceDefinition":
			continue
		case "Deployment":
			d := kubetest.Typed[appsv1.Deployment](t, o)
			args = d.Spec.Template.Spec.Containers[0].Args
			continue
		}
		if err := kubetest.Apply(ctx, admin, o, "test"); err != nil {
			t.Fatalf("apply %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}

	// The Deployment's flags, through the operator's flag set; then only what differs outside a
	// pod: local addresses, a writable certificate directory, the Lease's namespace (in a pod,
	// the pod's own).
	c := parseArgs(t, args)
	if !c.leaderElect || !c.metricsSecure || !c.webhookEnable {
		t.Fatalf("config/default runs the operator with --leader-elect, secure metrics and the webhook: %+v", c)
	}
	metricsAddr := freeAddr(t)
	c.metricsAddr, c.probeAddr, c.leaderElectionNamespace = metricsAddr, "0", opNamespace
	c.webhook.Host, c.webhook.Certs.CertDir = "127.0.0.1", t.TempDir()
	_, port, _ := net.SplitHostPort(freeAddr(t))
	fmt.Sscan(port, &c.webhook.Port)

	// Every request of the operator as its ServiceAccount.
	mgr, err := newManager(asOperator(cfg), c)
	if err != nil {
		t.Fatal(err)
	}
	// Elected: config/rbac/leader_election_role.yaml's Lease rule works.
	start(t, ctx, mgr)

	t.Run("LeaderElection", func(t *testing.T) {
		lease := &coordinationv1.Lease{}
		if err := admin.Get(ctx, client.ObjectKey{Namespace: opNamespace, Name: "operator.storage.peregrine.dev"}, lease); err != nil {
			t.Fatalf("the Lease: %v", err)
		}
		if h := ptr.Deref(lease.Spec.HolderIdentity, ""); h == "" {
			t.Error("the Lease has no holder")
		}
	})

	t.Run("RendersWithoutDelete", func(t *testing.T) {
		ss := newServerSet("default", "tank")
		if err := admin.Create(ctx, ss); err != nil {
			t.Fatal(err)
		}
		sts := &appsv1.StatefulSet{}
		eventually(t, 60*time.Second, "the StatefulSet", func() error {
			return admin.Get(ctx, client.ObjectKeyFromObject(ss), sts)
		})
		if sc := sts.Spec.Template.Spec.Containers[0].SecurityContext; sc == nil || ptr.Deref(sc.Privileged, true) {
			t.Errorf("an emulated-storage engine runs privileged: %+v", sc)
		}
		for _, o := range []client.Object{&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "tank-config"}}, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "tank"}}} {
			if err := admin.Get(ctx, client.ObjectKey{Namespace: "default", Name: o.GetName()}, o); err != nil {
				t.Errorf("%T %s: %v", o, o.GetName(), err)
			}
		}
		eventually(t, 60*time.Second, "the ServerSet's status", func() error {
			got := &storagev1.ServerSet{}
			if err := admin.Get(ctx, client.ObjectKeyFromObject(ss), got); err != nil {
				return err
			}
			if c := meta.FindStatusCondition(got.Status.Conditions, storagev1.ConditionReady); c == nil || c.Reason != "ManagementServiceUnreachable" {
				return fmt.Errorf("Ready %+v", c)
			}
			return nil
		})
		cr := &rbacv1.ClusterRole{}
		if err := admin.Get(ctx, client.ObjectKey{Name: "peregrine-operator"}, cr); err != nil {
			t.Fatal(err)
		}
		for _, r := range cr.Rules {
			for _, v := range r.Verbs {
				if v == "delete" || v == "*" || v == "deletecollection" {
					t.Errorf("the operator's ClusterRole grants %s on %v", v, r.Resources)
				}
			}
		}
	})

	t.Run("WebhookCertificate", func(t *testing.T) {
		eventually(t, 60*time.Second, "the webhook's Secret", func() error {
			return admin.Get(ctx, client.ObjectKey{Namespace: opNamespace, Name: c.webhook.Certs.SecretName}, &corev1.Secret{})
		})
	})

	t.Run("AdmissionPolicy", func(t *testing.T) {
		for field, mutate := range map[string]func(*storagev1.ServerSet){
			"spec.image": func(ss *storagev1.ServerSet) { ss.Spec.Image = "evil.example.com/engine:1" },
			"spec.storage.emulated.hostPath": func(ss *storagev1.ServerSet) {
				ss.Spec.Storage.Emulated.HostPath = "/var/lib/peregrine/../../etc"
			},
			"spec.storage.nvme.device": func(ss *storagev1.ServerSet) {
				ss.Spec.Storage.Emulated, ss.Spec.Storage.Nvme = nil, &storagev1.NvmeStorage{Device: "/dev/sda"}
			},
		} {
			ss := &storagev1.ServerSet{
				ObjectMeta: metav1.ObjectMeta{Name: "refused", Namespace: "default"},
				Spec: storagev1.ServerSetSpec{Image: "peregrine/engine:dev", Engines: 1,
					Storage: storagev1.EngineStorage{Scm: "256MiB",
						Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine/e2e", Size: "1GiB"}}},
			}
			mutate(ss)
			// The API server loads a new policy within seconds.
			eventually(t, 30*time.Second, field, func() error {
				err := admin.Create(ctx, ss.DeepCopy(), client.DryRunAll)
				if err == nil {
					return fmt.Errorf("a ServerSet with a bad %s was admitted", field)
				}
				if !strings.Contains(err.Error(), field+": Forbidden") {
					t.Fatalf("refused, but not naming %s: %v", field, err)
				}
				t.Logf("refused: %v", err)
				return nil
			})
		}
		ok := &storagev1.ServerSet{
			ObjectMeta: metav1.ObjectMeta{Name: "allowed", Namespace: "default"},
			Spec: storagev1.ServerSetSpec{Image: "peregrine/engine@sha256:0123", Engines: 1,
				Storage: storagev1.EngineStorage{Scm: "256MiB", Nvme: &storagev1.NvmeStorage{Device: "/dev/disk/by-id/nvme-eui.01"}}},
		}
		if err := admin.Create(ctx, ok, client.DryRunAll); err != nil {
			t.Errorf("an allowed ServerSet was refused: %v", err)
		}
	})

	t.Run("MetricsAuth", func(t *testing.T) {
		cs, err := kubernetes.NewForConfig(cfg)
		if err != nil {
			t.Fatal(err)
		}
		token := func(name string) string {
			if _, err := cs.CoreV1().ServiceAccounts("default").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			tr, err := cs.CoreV1().ServiceAccounts("default").CreateToken(ctx, name,
				&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)}}, metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return tr.Status.Token
		}
		scraper, stranger := token("scraper"), token("stranger")
		if err := admin.Create(ctx, &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "scraper-metrics"},
			RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "peregrine-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "scraper", Namespace: "default"}},
		}); err != nil {
			t.Fatal(err)
		}
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			// The operator's certificate is self-signed; what is checked is the caller.
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
		}}
		get := func(scheme, tok string) (int, string, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://"+metricsAddr+"/metrics", nil)
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := hc.Do(req)
			if err != nil {
				return 0, "", err
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b), nil
		}
		want := func(scheme, tok string, code int, body string) {
			t.Helper()
			eventually(t, 30*time.Second, fmt.Sprintf("%s with token %v", scheme, tok != ""), func() error {
				got, b, err := get(scheme, tok)
				if err != nil {
					return err
				}
				if got != code || !strings.Contains(b, body) {
					return fmt.Errorf("HTTP %d (want %d): %.200s", got, code, b)
				}
				return nil
			})
		}
		want("https", "", http.StatusUnauthorized, "")
		want("https", stranger, http.StatusForbidden, "")
		want("https", scraper, http.StatusOK, "controller_runtime_reconcile_total")
		if code, _, err := get("http", ""); err == nil && code == http.StatusOK {
			t.Error("metrics answered over plain HTTP")
		}
	})
}
