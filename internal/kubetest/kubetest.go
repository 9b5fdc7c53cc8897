// Package kubetest holds what the manifest tests (csi/deploy, charts) share: the kube binaries of
// hack/build-kube.sh, kustomize builds, YAML streams as objects, and a real kube-apiserver
// (envtest) that validates fields strictly.
package kubetest

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeAssets points KUBEBUILDER_ASSETS at hack/build-kube.sh's directory when it is unset and
// returns it.
func KubeAssets(t testing.TB) string {
	t.Helper()
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		cache := os.Getenv("XDG_CACHE_HOME")
		if cache == "" {
			home, _ := os.UserHomeDir()
			cache = filepath.Join(home, ".cache")
		}
		t.Setenv("KUBEBUILDER_ASSETS", filepath.Join(cache, "peregrine", "kube-v1.35.4", "bin"))
	}
	return os.Getenv("KUBEBUILDER_ASSETS")
}

// Decode splits a YAML stream into objects; what names the stream in failures.
func Decode(t testing.TB, what string, r io.Reader) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var objs []*unstructured.Unstructured
	for {
		m := map[string]any{}
		if err := dec.Decode(&m); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if len(m) > 0 {
			objs = append(objs, &unstructured.Unstructured{Object: m})
		}
	}
	if len(objs) == 0 {
		t.Fatalf("%s: no objects", what)
	}
	return objs
}

// Kustomize builds a kustomization directory with the kubectl of KUBEBUILDER_ASSETS.
func Kustomize(t testing.TB, dir string) []*unstructured.Unstructured {
	t.Helper()
	kubectl := filepath.Join(KubeAssets(t), "kubectl")
	if _, err := os.Stat(kubectl); err != nil {
		t.Fatalf("no kubectl in KUBEBUILDER_ASSETS (make kube-bin builds it): %v", err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", dir)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, stderr.String())
	}
	return Decode(t, "kustomize "+dir, &stdout)
}

// Find returns the one object of a kind and name (name "" for the only one of the kind).
func Find(t testing.TB, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	var hits []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind && (name == "" || o.GetName() == name) {
			hits = append(hits, o)
		}
	}
	if len(hits) != 1 {
		t.Fatalf("want one %s %q, found %d", kind, name, len(hits))
	}
	return hits[0]
}

// Typed converts an object, refusing fields its Go type does not know.
func Typed[T any](t testing.TB, u *unstructured.Unstructured) *T {
	t.Helper()
	out := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, out, true); err != nil {
		t.Fatalf("%s %s/%s: %v", u.GetKind(), u.GetNamespace(), u.GetName(), err)
	}
	return out
}

// StartEnv runs etcd and kube-apiserver for the test and returns a client of the core types and
// those addToScheme adds, which validates fields strictly.
func StartEnv(t testing.TB, addToScheme ...func(*runtime.Scheme) error) client.Client {
	t.Helper()
	dir := KubeAssets(t)
	if _, err := os.Stat(filepath.Join(dir, "kube-apiserver")); err != nil {
		t.Fatalf("KUBEBUILDER_ASSETS=%s has no kube-apiserver (make kube-bin builds it): %v", dir, err)
	}
	env := &envtest.Environment{BinaryAssetsDirectory: dir}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Logf("envtest stop: %v", err)
		}
	})
	scheme := runtime.NewScheme()
	for _, add := range append([]func(*runtime.Scheme) error{clientgoscheme.AddToScheme}, addToScheme...) {
		if err := add(scheme); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return client.WithFieldValidation(c, metav1.FieldValidationStrict)
}

// Apply server-side applies a copy of u as owner, taking over conflicting fields.
func Apply(ctx context.Context, c client.Client, u *unstructured.Unstructured, owner string, opts ...client.ApplyOption) error {
	opts = append(opts, client.FieldOwner(owner), client.ForceOwnership)
	return c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u.DeepCopy()), opts...)
}
