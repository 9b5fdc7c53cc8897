// Package charts holds the checks of the Helm chart charts/peregrine; there is no non-test code.
//
// The chart is rendered with the helm binary that hack/build-helm.sh builds from its Go module
// (HELM names another), as a user renders it: `helm template` with the chart's defaults and with
// each profile (values-gke.yaml, values-onprem.yaml).
//
// TestRender checks, without an API server, that the default render is what config/ deploys
// (kustomize's config/default and config/csi, object for object, spec for spec: the kustomize
// manifests are the ones csi/deploy tests and the cluster runs), and the invariants a values file
// must not break: the node plugin privileged with Bidirectional propagation into the kubelet's
// directory, namespaced leader-election Roles, no ClusterRole granting more than kustomize's,
// every namespaced object in the release's namespace, the schema refusing typos; and the least
// privilege settings: the NetworkPolicies (off by default; enabled, admitting Peregrine's own pods
// by their rendered labels, the listed namespaces on the listed ports and the node CIDRs),
// watchNamespaces moving the operator's namespaced rules into Roles, the engine policy carried
// identically by the operator's flags and the admission policy, metrics scraped over HTTPS.
//
// TestDryRun applies every rendered object of every profile to a real kube-apiserver (envtest)
// with server-side apply, dry-run and strict field validation: the API server validates each
// manifest, the CRDs' CEL rules included (the chart's CRDs are applied for real first). The
// admission policy is applied for real too: every profile's ServerSet passes it, and ServerSets
// outside the default lists are refused with a message naming the field.
package charts

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/peregrine-storage/peregrine/csi"
	"github.com/peregrine-storage/peregrine/internal/kubetest"
)

const (
	chartDir     = "peregrine"
	release      = "peregrine"
	namespace    = "peregrine-system"
	fieldManager = "peregrine-chart-test"
	kubeletDir   = "/var/lib/kubelet"
	monitoringGV = "monitoring.coreos.com"
)

// profiles are the value files the chart documents; "" is the defaults.
var profiles = []string{"", "values-gke.yaml", "values-onprem.yaml"}

// helmBin returns the helm binary: HELM, else hack/build-helm.sh's (built once, then cached).
func helmBin(t *testing.T) string {
	t.Helper()
	if h := os.Getenv("HELM"); h != "" {
		return h
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", "../hack/build-helm.sh")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/build-helm.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(stdout.String())
}

// run runs a command and returns its stdout, or its error with stderr.
func run(name string, args ...string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return stdout.Bytes(), nil
}

// templateArgs are helm template's arguments for a profile and extra flags.
func templateArgs(profile string, extra ...string) []string {
	args := []string{"template", release, chartDir, "--namespace", namespace}
	if profile != "" {
		args = append(args, "-f", filepath.Join(chartDir, profile))
	}
	return append(args, extra...)
}

// render is `helm template` of the chart with a profile and extra flags (--set, --include-crds).
func render(t *testing.T, profile string, extra ...string) []*unstructured.Unstructured {
	t.Helper()
	out, err := run(helmBin(t), templateArgs(profile, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	return kubetest.Decode(t, "helm template "+profile, bytes.NewReader(out))
}

func key(o *unstructured.Unstructured) string {
	return o.GetKind() + " " + o.GetNamespace() + "/" + o.GetName()
}

// explicitDefaults are operator flags the chart spells out with the binary's own defaults
// (cmd/operator), which config/manager leaves implicit.
var explicitDefaults = []string{
	"--status-refresh=30s", "--zap-log-level=info", "--webhook-port=9443",
	"--webhook-namespace=" + namespace, "--il-host-dir=/var/lib/peregrine/il",
	"--cert-lifetime=2160h", "--ca-lifetime=43800h", "--ca-rotation-dwell=3m",
}

// normalize drops what may differ between the chart and kustomize without changing what runs:
// labels and annotations outside selectors (Helm's, and the checksum that rolls pods), the hash
// suffix of kustomize's ConfigMap name (hashed, renamed to the chart's wherever it is named), and
// the operator's explicit default flags.
func normalize(o *unstructured.Unstructured, hashed string) map[string]any {
	c := o.DeepCopy()
	unstructured.RemoveNestedField(c.Object, "metadata", "labels")
	unstructured.RemoveNestedField(c.Object, "metadata", "annotations")
	unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata", "labels")
	unstructured.RemoveNestedField(c.Object, "spec", "template", "metadata", "annotations")
	b, _ := json.Marshal(c.Object)
	if hashed != "" {
		b = bytes.ReplaceAll(b, []byte(`"`+hashed+`"`), []byte(`"peregrine-csi"`))
	}
	m := map[string]any{}
	_ = json.Unmarshal(b, &m)
	if c.GetKind() == "Deployment" && c.GetName() == "peregrine-operator" {
		cs, _, _ := unstructured.NestedSlice(m, "spec", "template", "spec", "containers")
		for _, ci := range cs {
			cm := ci.(map[string]any)
			var args []any
			for _, a := range cm["args"].([]any) {
				if !slices.Contains(explicitDefaults, a.(string)) {
					args = append(args, a)
				}
			}
			cm["args"] = args
		}
		_ = unstructured.SetNestedSlice(m, cs, "spec", "template", "spec", "containers")
	}
	return m
}

// lineDiff shows the first lines where two JSON documents differ.
func lineDiff(a, b map[string]any) string {
	ja, _ := json.MarshalIndent(a, "", " ")
	jb, _ := json.MarshalIndent(b, "", " ")
	la, lb := strings.Split(string(ja), "\n"), strings.Split(string(jb), "\n")
	var out []string
	for i := 0; i < max(len(la), len(lb)) && len(out) < 12; i++ {
		var x, y string
		if i < len(la) {
			x = la[i]
		}
		if i < len(lb) {
			y = lb[i]
		}
		if x != y {
			out = append(out, fmt.Sprintf("line %d: kustomize %q, chart %q", i+1, strings.TrimSpace(x), strings.TrimSpace(y)))
		}
	}
	return strings.Join(out, "\n")
}

// grants is the set of "group resource verb" a rule list allows (no wildcards are used here).
func grants(rules []rbacv1.PolicyRule) map[string]bool {
	g := map[string]bool{}
	for _, r := range rules {
		for _, gr := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					g[gr+" "+res+" "+v] = true
				}
			}
		}
	}
	return g
}

func TestRender(t *testing.T) {
	kust := append(kubetest.Kustomize(t, "../config/default"), kubetest.Kustomize(t, "../config/csi")...)
	chart := render(t, "", "--include-crds")

	// The default install is what config/ deploys: the same objects (the chart leaves the
	// Namespace to `helm --create-namespace` and adds a StorageClass), with the same specs.
	t.Run("MatchesKustomize", func(t *testing.T) {
		hashed := ""
		for _, k := range kust {
			if k.GetKind() == "ConfigMap" && strings.HasPrefix(k.GetName(), "peregrine-csi-") {
				hashed = k.GetName()
			}
		}
		byKey := map[string]*unstructured.Unstructured{}
		for _, o := range chart {
			byKey[key(o)] = o
		}
		seen := map[string]bool{}
		for _, k := range kust {
			if k.GetKind() == "Namespace" {
				continue
			}
			a := normalize(k, hashed)
			kk := key(&unstructured.Unstructured{Object: a})
			if seen[kk] {
				continue
			}
			seen[kk] = true
			c, ok := byKey[kk]
			if !ok {
				t.Errorf("the chart has no %s", kk)
				continue
			}
			b := normalize(c, "")
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if !bytes.Equal(ja, jb) {
				t.Errorf("%s differs from config/:\n%s", kk, lineDiff(a, b))
			}
		}
		for kk, o := range byKey {
			if !seen[kk] && o.GetKind() != "StorageClass" {
				t.Errorf("the chart has %s, config/ does not", kk)
			}
		}
	})

	for _, p := range profiles {
		objs := chart
		if p != "" {
			objs = render(t, p)
		}
		name := strings.TrimSuffix(p, ".yaml")
		if name == "" {
			name = "defaults"
		}
		t.Run("Invariants/"+name, func(t *testing.T) { invariants(t, objs, kust) })
	}

	t.Run("KubeletDir", func(t *testing.T) {
		const moved = "/var/lib/k0s/kubelet"
		objs := render(t, "", "--set", "csi.kubeletDir="+moved+"/")
		ds := kubetest.Find(t, objs, "DaemonSet", "peregrine-csi-node")
		b, _ := json.Marshal(ds.Object)
		if strings.Contains(string(b), `"`+kubeletDir) {
			t.Errorf("the DaemonSet still names %s:\n%s", kubeletDir, b)
		}
		for _, want := range []string{
			`"path":"` + moved + `"`, `"mountPath":"` + moved + `"`, `"path":"` + moved + `/plugins_registry"`,
			`"--kubelet-endpoint=` + moved + `/plugins/csi.peregrine.dev/csi.sock"`,
		} {
			if !strings.Contains(string(b), want) {
				t.Errorf("no %s in the DaemonSet", want)
			}
		}
	})

	t.Run("MgmtAddress", func(t *testing.T) {
		cm := kubetest.Typed[corev1.ConfigMap](t, kubetest.Find(t, chart, "ConfigMap", "peregrine-csi"))
		if got := cm.Data["PEREGRINE_MGMT"]; got != "tank-0.tank.default.svc:10001" {
			t.Errorf("default PEREGRINE_MGMT %q", got)
		}
		objs := render(t, "", "--set", "serverSet.enabled=true,serverSet.name=fast,serverSet.spec.controlPort=10002")
		cm = kubetest.Typed[corev1.ConfigMap](t, kubetest.Find(t, objs, "ConfigMap", "peregrine-csi"))
		if got := cm.Data["PEREGRINE_MGMT"]; got != "fast-0.fast."+namespace+".svc:10002" {
			t.Errorf("PEREGRINE_MGMT with a ServerSet %q", got)
		}
		pa, _, _ := unstructured.NestedString(kubetest.Find(t, chart, "DaemonSet", "peregrine-csi-node").Object, "spec", "template", "metadata", "annotations", "checksum/mgmt")
		pb, _, _ := unstructured.NestedString(kubetest.Find(t, objs, "DaemonSet", "peregrine-csi-node").Object, "spec", "template", "metadata", "annotations", "checksum/mgmt")
		if pa == "" || pa == pb {
			t.Errorf("a new management address does not roll the node plugin (checksum %q, %q)", pa, pb)
		}
	})

	// The node agent: unprivileged, with the node's client certificate, its socket in a host
	// directory; absent without the CSI driver (whose certificate and ConfigMap it uses) or when
	// turned off. (The engines' NetworkPolicy lets it reach their control port: NetworkPolicy.)
	t.Run("Agent", func(t *testing.T) {
		ds := kubetest.Typed[appsv1.DaemonSet](t, kubetest.Find(t, chart, "DaemonSet", "peregrine-agent"))
		spec := ds.Spec.Template.Spec
		c := spec.Containers[0]
		if sc := c.SecurityContext; sc == nil || ptrTrue(sc.Privileged) || !ptrFalse(sc.AllowPrivilegeEscalation) ||
			sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || spec.HostNetwork || spec.HostPID {
			t.Errorf("the agent is not unprivileged: %+v, hostNetwork %v, hostPID %v", c.SecurityContext, spec.HostNetwork, spec.HostPID)
		}
		if !slices.Contains(c.Args, "--socket=/run/peregrine/agent.sock") || !slices.Contains(c.Args, "--tls-dir=/etc/peregrine-tls") {
			t.Errorf("agent args %v", c.Args)
		}
		secret, socketDir := "", ""
		for _, v := range spec.Volumes {
			if v.Secret != nil {
				secret = v.Secret.SecretName
			}
			if v.HostPath != nil {
				socketDir = v.HostPath.Path
			}
		}
		if secret != "peregrine-csi-node-tls" || socketDir != "/run/peregrine" {
			t.Errorf("agent certificate %q (want the node's client one), socket directory %q", secret, socketDir)
		}
		for _, set := range []string{"agent.enabled=false", "csi.enabled=false"} {
			for _, o := range render(t, "", "--set", set) {
				if o.GetName() == "peregrine-agent" {
					t.Errorf("%s, still %s", set, key(o))
				}
			}
		}
	})

	t.Run("WebhookOff", func(t *testing.T) {
		objs := render(t, "", "--set", "webhook.enabled=false")
		for _, o := range objs {
			if o.GetKind() == "MutatingWebhookConfiguration" || (o.GetKind() == "Role" && o.GetName() == "peregrine-operator") {
				t.Errorf("webhook off, still %s", key(o))
			}
		}
		d := kubetest.Typed[appsv1.Deployment](t, kubetest.Find(t, objs, "Deployment", "peregrine-operator"))
		if slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--webhook-enable") {
			t.Error("webhook off, the operator still serves it")
		}
	})

	t.Run("Monitoring", func(t *testing.T) {
		objs := render(t, "", "--set", "metrics.serviceMonitor.enabled=true,metrics.dashboards.enabled=true")
		svc := kubetest.Typed[corev1.Service](t, kubetest.Find(t, objs, "Service", "peregrine-operator-metrics"))
		sm := kubetest.Find(t, objs, "ServiceMonitor", "peregrine-operator")
		sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
		for k, v := range sel {
			if svc.Labels[k] != v {
				t.Errorf("the ServiceMonitor selects %s=%s, the metrics Service has %q", k, v, svc.Labels[k])
			}
		}
		if svc.Spec.Ports[0].Name != "metrics" || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
			t.Errorf("metrics Service ports %+v", svc.Spec.Ports)
		}
		eps0, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
		if len(eps0) != 1 || eps0[0].(map[string]any)["scheme"] != "https" || eps0[0].(map[string]any)["bearerTokenFile"] == nil {
			t.Errorf("the operator's ServiceMonitor does not scrape over HTTPS with a token: %v", eps0)
		}
		if svc.Spec.Ports[0].Port != 8443 {
			t.Errorf("metrics Service port %d, the operator serves HTTPS on 8443", svc.Spec.Ports[0].Port)
		}
		objs2 := render(t, "", "--set", "metrics.readerServiceAccounts[0].name=prometheus,metrics.readerServiceAccounts[0].namespace=monitoring")
		crb := kubetest.Typed[rbacv1.ClusterRoleBinding](t, kubetest.Find(t, objs2, "ClusterRoleBinding", "peregrine-metrics-reader"))
		if crb.RoleRef.Name != "peregrine-metrics-reader" || len(crb.Subjects) != 1 || crb.Subjects[0].Name != "prometheus" || crb.Subjects[0].Namespace != "monitoring" {
			t.Errorf("metrics reader binding %+v", crb)
		}
		if svc.Labels["app.kubernetes.io/component"] != "metrics" {
			t.Error("the metrics Service is not told apart from the webhook's (same name label)")
		}
		pm := kubetest.Find(t, objs, "PodMonitor", "peregrine-engines")
		if n, _, _ := unstructured.NestedString(pm.Object, "spec", "selector", "matchLabels", "app.kubernetes.io/name"); n != "peregrine-engine" {
			t.Errorf("the PodMonitor selects %q, the operator labels engine pods peregrine-engine", n)
		}
		eps, _, _ := unstructured.NestedSlice(pm.Object, "spec", "podMetricsEndpoints")
		if len(eps) != 1 || eps[0].(map[string]any)["port"] != "metrics" {
			t.Errorf("PodMonitor endpoints %v", eps)
		}
		dash, err := filepath.Glob(filepath.Join(chartDir, "dashboards", "*.json"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, o := range objs {
			if o.GetKind() == "ConfigMap" && o.GetLabels()["grafana_dashboard"] == "1" {
				n++
			}
		}
		if n != len(dash) {
			t.Errorf("%d dashboard ConfigMaps for %d dashboards/*.json", n, len(dash))
		}
	})

	t.Run("NetworkPolicy", func(t *testing.T) { networkPolicies(t, chart) })
	t.Run("WatchNamespaces", func(t *testing.T) { watchNamespaces(t, kust) })
	t.Run("EnginePolicy", func(t *testing.T) { enginePolicy(t, chart) })

	// The schema refuses what would otherwise be silently ignored or rendered invalid.
	t.Run("Schema", func(t *testing.T) {
		for _, set := range []string{
			"csi.kubletDir=/x", "imagePullPolicy=Sometimes", "csi.mgmtAddress=no-port",
			"webhook.failurePolicy=Maybe", "operator.extraArgs[0]=leader-elect", "csi.kubeletDir=relative",
			// An image prefix that would also allow registry.example.com.evil.org/...
			"operator.enginePolicy.allowedImages[0]=registry.example.com",
			"operator.enginePolicy.allowedHostPaths[0]=/var/lib/../../etc", "operator.enginePolicy.allowedHostPaths[0]=/",
			"operator.enginePolicy.allowedDevices[0]=/etc/", "operator.watchNamespaces[0]=Not_A_Namespace",
			"networkPolicy.nodeCIDRs[0]=10.0.0.0", "networkPolicy.enabeld=true",
		} {
			if _, err := run(helmBin(t), templateArgs("", "--set", set)...); err == nil {
				t.Errorf("--set %s was accepted", set)
			}
		}
	})
}

// invariants are what every values file must keep.
func invariants(t *testing.T, objs, kust []*unstructured.Unstructured) {
	ds := kubetest.Typed[appsv1.DaemonSet](t, kubetest.Find(t, objs, "DaemonSet", "peregrine-csi-node"))
	spec := &ds.Spec.Template.Spec
	if ds.Spec.Selector.MatchLabels["app.kubernetes.io/name"] != "peregrine-csi-node" ||
		spec.ServiceAccountName != "peregrine-csi-node" || !spec.HostPID || !spec.HostNetwork {
		t.Error("node DaemonSet: label app.kubernetes.io/name=peregrine-csi-node (the e2e suite finds it by it), hostPID, hostNetwork")
	}
	var driver *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "peregrine-csi" {
			driver = &spec.Containers[i]
		}
	}
	if driver == nil {
		t.Fatal("no peregrine-csi container in the node DaemonSet")
	}
	if sc := driver.SecurityContext; sc == nil || sc.Privileged == nil || !*sc.Privileged {
		t.Error("the node plugin is not privileged")
	}
	bidi, fuse := false, false
	for _, m := range driver.VolumeMounts {
		for _, v := range spec.Volumes {
			if v.Name != m.Name || v.HostPath == nil {
				continue
			}
			if m.MountPath == kubeletDir && v.HostPath.Path == kubeletDir &&
				m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional {
				bidi = true
			}
			if m.MountPath == "/dev/fuse" && v.HostPath.Path == "/dev/fuse" {
				fuse = true
			}
		}
	}
	if !bidi || !fuse {
		t.Errorf("node plugin: %s Bidirectional %v, /dev/fuse %v", kubeletDir, bidi, fuse)
	}

	want := map[string]map[string]bool{}
	for _, k := range kust {
		if k.GetKind() == "ClusterRole" {
			want[k.GetName()] = grants(kubetest.Typed[rbacv1.ClusterRole](t, k).Rules)
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterRole":
			have := grants(kubetest.Typed[rbacv1.ClusterRole](t, o).Rules)
			base, ok := want[o.GetName()]
			if !ok {
				t.Errorf("ClusterRole %s is not one of config/'s", o.GetName())
			}
			for g := range have {
				if !base[g] {
					t.Errorf("ClusterRole %s grants %q, config/'s does not", o.GetName(), g)
				}
			}
		case "Role":
			r := kubetest.Typed[rbacv1.Role](t, o)
			if r.Namespace != namespace {
				t.Errorf("Role %s in namespace %q", r.Name, r.Namespace)
			}
			if strings.HasSuffix(r.Name, "leader-election") {
				for g := range grants(r.Rules) {
					if !strings.HasPrefix(g, "coordination.k8s.io leases ") && !strings.HasPrefix(g, " events ") {
						t.Errorf("leader-election Role %s grants %q", r.Name, g)
					}
				}
			}
		case "ClusterRoleBinding", "RoleBinding":
			var subjects []rbacv1.Subject
			if o.GetKind() == "RoleBinding" {
				subjects = kubetest.Typed[rbacv1.RoleBinding](t, o).Subjects
			} else {
				subjects = kubetest.Typed[rbacv1.ClusterRoleBinding](t, o).Subjects
			}
			for _, s := range subjects {
				if s.Kind != "ServiceAccount" || s.Namespace != namespace {
					t.Errorf("%s: subject %+v", key(o), s)
				}
				kubetest.Find(t, objs, "ServiceAccount", s.Name)
			}
		case "StorageClass":
			sc := kubetest.Typed[storagev1.StorageClass](t, o)
			if _, err := csi.ParseParams(sc.Parameters, ""); err != nil {
				t.Errorf("StorageClass %s: the driver refuses its parameters: %v", sc.Name, err)
			}
		case "ServerSet", "Pool":
			if o.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
				t.Errorf("%s: helm uninstall would delete it (and its data) with the operator its finalizers need", key(o))
			}
		}
		scoped := o.GetNamespace() != ""
		if scoped && o.GetNamespace() != namespace {
			t.Errorf("%s is outside the release namespace", key(o))
		}
	}
	found := false
	for _, o := range objs {
		if o.GetKind() == "Role" && o.GetName() == "peregrine-operator-leader-election" {
			found = true
		}
	}
	if !found {
		t.Error("no namespaced leader-election Role for the operator")
	}
}

func TestDryRun(t *testing.T) {
	c := kubetest.StartEnv(t, apiextensionsv1.AddToScheme)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// What `helm install --create-namespace` and the cluster provide: the namespace, and the CRDs
	// (from the chart's crds/, applied for real so that ServerSets and Pools can be validated).
	for _, n := range []string{namespace, "default"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: n}}
		if err := c.Create(ctx, ns); client.IgnoreAlreadyExists(err) != nil {
			t.Fatal(err)
		}
	}
	for _, o := range render(t, "", "--include-crds") {
		if o.GetKind() != "CustomResourceDefinition" {
			continue
		}
		if err := kubetest.Apply(ctx, c, o, fieldManager); err != nil {
			t.Fatalf("CRD %s: %v", o.GetName(), err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := c.Get(ctx, client.ObjectKey{Name: o.GetName()}, crd); err != nil {
				t.Fatal(err)
			}
			est := false
			for _, cond := range crd.Status.Conditions {
				est = est || (cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue)
			}
			if est {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("CRD %s not established", o.GetName())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// The engine policy at admission, for real: every profile's ServerSet below must pass it.
	defaults := render(t, "")
	for _, kind := range []string{"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} {
		if err := kubetest.Apply(ctx, c, kubetest.Find(t, defaults, kind, "peregrine-serverset-engine-policy"), fieldManager); err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
	t.Run("AdmissionPolicy", func(t *testing.T) {
		base := kubetest.Find(t, render(t, "values-gke.yaml"), "ServerSet", "tank")
		for _, bad := range []struct{ field, path, value string }{
			{"spec.image", "image", "evil.example.com/peregrine/engine:dev"},
			{"spec.image", "image", "peregrine/engine-evil:dev"},
			{"spec.storage.nvme.device", "device", "/dev/sda"},
			{"spec.storage.nvme.device", "device", "/dev/nvme/../sda"},
		} {
			ss := base.DeepCopy()
			if bad.path == "image" {
				_ = unstructured.SetNestedField(ss.Object, bad.value, "spec", "image")
			} else {
				_ = unstructured.SetNestedField(ss.Object, bad.value, "spec", "storage", "nvme", "device")
			}
			// A new policy takes the API server a moment to load.
			deadline := time.Now().Add(30 * time.Second)
			for {
				err := kubetest.Apply(ctx, c, ss, fieldManager, client.DryRunAll)
				if err != nil {
					if !strings.Contains(err.Error(), bad.field+": Forbidden") {
						t.Errorf("%s %q refused, but not naming the field: %v", bad.field, bad.value, err)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("%s %q admitted", bad.field, bad.value)
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		emu := kubetest.Find(t, render(t, "", "--set", "serverSet.enabled=true"), "ServerSet", "tank").DeepCopy()
		_ = unstructured.SetNestedField(emu.Object, "/var/lib/peregrine-other", "spec", "storage", "emulated", "hostPath")
		if err := kubetest.Apply(ctx, c, emu, fieldManager, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "spec.storage.emulated.hostPath: Forbidden") {
			t.Errorf("a sibling of the allowed host path: want a refusal naming the field, got %v", err)
		}
		// The control plane without TLS: refused unless controlPlane.insecure.
		plain := kubetest.Find(t, render(t, "", "--set", "serverSet.enabled=true"), "ServerSet", "tank").DeepCopy()
		_ = unstructured.SetNestedField(plain.Object, true, "spec", "insecureControlPlane")
		if err := kubetest.Apply(ctx, c, plain, fieldManager, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "spec.insecureControlPlane: Forbidden") {
			t.Errorf("spec.insecureControlPlane: want a refusal naming the field, got %v", err)
		}
	})

	for _, p := range profiles {
		name := strings.TrimSuffix(p, ".yaml")
		if name == "" {
			name = "defaults"
		}
		t.Run(name, func(t *testing.T) {
			// Everything the profile can turn on: ServerSet, Pool, monitoring, dashboards,
			// NetworkPolicies with every kind of peer, the namespaced RBAC of watchNamespaces.
			objs := render(t, p, "--set", "metrics.serviceMonitor.enabled=true,metrics.dashboards.enabled=true,"+
				"networkPolicy.enabled=true,networkPolicy.clientNamespaces={default},networkPolicy.metricsNamespaces={default},"+
				"networkPolicy.nodeCIDRs={10.0.0.0/8},metrics.readerServiceAccounts[0].name=prometheus,"+
				"metrics.readerServiceAccounts[0].namespace=default")
			if p == "" {
				objs = append(objs, render(t, p, "--set", "operator.watchNamespaces={default}")...)
			}
			applied := 0
			for _, o := range objs {
				if strings.HasPrefix(o.GetAPIVersion(), monitoringGV+"/") {
					// The Prometheus Operator's CRDs are not this repository's; TestRender
					// checks what these objects select. The default render has none.
					t.Logf("not applied (no %s CRDs here): %s", monitoringGV, key(o))
					continue
				}
				if err := kubetest.Apply(ctx, c, o, fieldManager, client.DryRunAll); err != nil {
					t.Errorf("server-side dry-run apply of %s: %v", key(o), err)
				}
				applied++
			}
			t.Logf("%d objects validated by the API server", applied)
		})
	}

	// The dry run is a real validation: the API server refuses a broken object.
	t.Run("ValidationIsReal", func(t *testing.T) {
		ds := kubetest.Find(t, render(t, ""), "DaemonSet", "peregrine-csi-node").DeepCopy()
		cs, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		delete(cs[0].(map[string]any), "securityContext")
		_ = unstructured.SetNestedSlice(ds.Object, cs, "spec", "template", "spec", "containers")
		if err := kubetest.Apply(ctx, c, ds, fieldManager, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "Bidirectional") {
			t.Errorf("an unprivileged Bidirectional DaemonSet: want a refusal, got %v", err)
		}
		ss := kubetest.Find(t, render(t, "values-gke.yaml"), "ServerSet", "tank").DeepCopy()
		_ = unstructured.SetNestedField(ss.Object, map[string]any{"hostPath": "/x", "size": "1GiB"}, "spec", "storage", "emulated")
		if err := kubetest.Apply(ctx, c, ss, fieldManager, client.DryRunAll); err == nil {
			t.Error("a ServerSet with both nvme and emulated storage was accepted (the CRD's CEL rule did not run)")
		}
	})
}

// networkPolicies: none by default; enabled, the engines' policy admits exactly Peregrine's own
// pods (by the labels the chart and the operator put on them), the listed namespaces on the
// listed ports, and the node CIDRs.
func networkPolicies(t *testing.T, defaults []*unstructured.Unstructured) {
	for _, o := range defaults {
		if o.GetKind() == "NetworkPolicy" {
			t.Errorf("a NetworkPolicy by default: %s", key(o))
		}
	}
	objs := render(t, "", "--set", "networkPolicy.enabled=true,networkPolicy.clientNamespaces={apps},"+
		"networkPolicy.metricsNamespaces={monitoring},networkPolicy.nodeCIDRs={192.168.0.0/16},"+
		"networkPolicy.engineNamespaces={default,store}")
	var engines []*networkingv1.NetworkPolicy
	for _, o := range objs {
		if o.GetKind() == "NetworkPolicy" && o.GetName() == "peregrine-engines" {
			engines = append(engines, kubetest.Typed[networkingv1.NetworkPolicy](t, o))
		}
	}
	if len(engines) != 2 || engines[0].Namespace != "default" || engines[1].Namespace != "store" {
		t.Fatalf("want the engines' policy in default and store, got %d", len(engines))
	}
	// The labels of Peregrine's own pods, as rendered.
	podName := func(kind, name string) string {
		o := kubetest.Find(t, objs, kind, name)
		n, _, _ := unstructured.NestedString(o.Object, "spec", "template", "metadata", "labels", "app.kubernetes.io/name")
		return n
	}
	own := []string{podName("Deployment", "peregrine-operator"), podName("Deployment", "peregrine-csi-controller"),
		podName("DaemonSet", "peregrine-csi-node")}
	np := engines[0]
	// What the operator labels engine pods with (controllers/serverset_render.go engineLabels).
	if np.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != "peregrine-engine" {
		t.Errorf("the policy selects %v", np.Spec.PodSelector.MatchLabels)
	}
	if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("policy types %v", np.Spec.PolicyTypes)
	}
	if len(np.Spec.Ingress) != 4 {
		t.Fatalf("want 4 ingress rules (own pods, node agents, clients, metrics), got %d", len(np.Spec.Ingress))
	}
	all := np.Spec.Ingress[0]
	if len(all.Ports) != 0 || len(all.From) != 3 {
		t.Fatalf("first rule: %+v", all)
	}
	if all.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != "peregrine-engine" || all.From[0].NamespaceSelector != nil {
		t.Errorf("engines of the same namespace: %+v", all.From[0])
	}
	comp := all.From[1]
	if comp.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != namespace ||
		!slices.Equal(comp.PodSelector.MatchExpressions[0].Values, own) {
		t.Errorf("Peregrine's components: %+v, their pods are labelled %v", comp, own)
	}
	if all.From[2].IPBlock == nil || all.From[2].IPBlock.CIDR != "192.168.0.0/16" {
		t.Errorf("node CIDRs: %+v", all.From[2])
	}
	ports := func(r networkingv1.NetworkPolicyIngressRule) []string {
		var p []string
		for _, x := range r.Ports {
			p = append(p, x.Port.String())
		}
		return p
	}
	if a := np.Spec.Ingress[1]; len(a.From) != 1 || a.From[0].NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != namespace ||
		a.From[0].PodSelector.MatchLabels["app.kubernetes.io/name"] != podName("DaemonSet", "peregrine-agent") ||
		!slices.Equal(ports(a), []string{"control"}) {
		t.Errorf("node agents (the control port only): %+v", a)
	}
	if c := np.Spec.Ingress[2]; !slices.Equal(c.From[0].NamespaceSelector.MatchExpressions[0].Values, []string{"apps"}) ||
		!slices.Equal(ports(c), []string{"control", "data"}) {
		t.Errorf("client namespaces: %+v", c)
	}
	if m := np.Spec.Ingress[3]; !slices.Equal(m.From[0].NamespaceSelector.MatchExpressions[0].Values, []string{"monitoring"}) ||
		!slices.Equal(ports(m), []string{"metrics"}) {
		t.Errorf("metrics namespaces: %+v", m)
	}
	// The port names are the engine container's (controllers/serverset_render.go).
	op := kubetest.Typed[networkingv1.NetworkPolicy](t, kubetest.Find(t, objs, "NetworkPolicy", "peregrine-operator"))
	if op.Namespace != namespace || op.Spec.PodSelector.MatchLabels["app.kubernetes.io/name"] != own[0] ||
		len(op.Spec.Ingress) != 2 || !slices.Equal(ports(op.Spec.Ingress[0]), []string{"webhook-server"}) ||
		!slices.Equal(ports(op.Spec.Ingress[1]), []string{"metrics"}) {
		t.Errorf("operator policy %+v", op.Spec)
	}
	// Without engineNamespaces: the chart's ServerSet's namespace.
	objs = render(t, "", "--set", "networkPolicy.enabled=true,serverSet.enabled=true,serverSet.namespace=store")
	if np := kubetest.Find(t, objs, "NetworkPolicy", "peregrine-engines"); np.GetNamespace() != "store" {
		t.Errorf("engines' policy in %q, the ServerSet is in store", np.GetNamespace())
	}
}

// watchNamespaces: the operator's namespaced rules move from its ClusterRole to a Role in each
// watched namespace, and the operator is told to watch only those.
func watchNamespaces(t *testing.T, kust []*unstructured.Unstructured) {
	objs := render(t, "", "--set", "operator.watchNamespaces={tenant-a,tenant-b}")
	full := grants(kubetest.Typed[rbacv1.ClusterRole](t, kubetest.Find(t, kust, "ClusterRole", "peregrine-operator")).Rules)
	cluster := grants(kubetest.Typed[rbacv1.ClusterRole](t, kubetest.Find(t, objs, "ClusterRole", "peregrine-operator")).Rules)
	clusterScoped := []string{"admissionregistration.k8s.io ", "authentication.k8s.io ", "authorization.k8s.io "}
	for g := range cluster {
		if !slices.ContainsFunc(clusterScoped, func(p string) bool { return strings.HasPrefix(g, p) }) {
			t.Errorf("with watchNamespaces the ClusterRole still grants %q", g)
		}
	}
	var roles []string
	for _, o := range objs {
		if o.GetKind() != "Role" || o.GetName() != "peregrine-operator-reconcile" {
			continue
		}
		roles = append(roles, o.GetNamespace())
		got := grants(kubetest.Typed[rbacv1.Role](t, o).Rules)
		for g := range full {
			if !cluster[g] && !got[g] {
				t.Errorf("Role in %s lacks %q", o.GetNamespace(), g)
			}
		}
		for g := range got {
			if !full[g] {
				t.Errorf("Role in %s grants %q, config/'s ClusterRole does not", o.GetNamespace(), g)
			}
		}
		var rb *rbacv1.RoleBinding
		for _, b := range objs {
			if b.GetKind() == "RoleBinding" && b.GetName() == "peregrine-operator-reconcile" && b.GetNamespace() == o.GetNamespace() {
				rb = kubetest.Typed[rbacv1.RoleBinding](t, b)
			}
		}
		if rb == nil || rb.RoleRef.Name != o.GetName() || len(rb.Subjects) != 1 ||
			rb.Subjects[0].Name != "peregrine-operator" || rb.Subjects[0].Namespace != namespace {
			t.Errorf("RoleBinding in %s: %+v", o.GetNamespace(), rb)
		}
	}
	if !slices.Equal(roles, []string{"tenant-a", "tenant-b"}) {
		t.Errorf("Roles in %v", roles)
	}
	d := kubetest.Typed[appsv1.Deployment](t, kubetest.Find(t, objs, "Deployment", "peregrine-operator"))
	if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--watch-namespaces=tenant-a,tenant-b") {
		t.Errorf("operator args %v", d.Spec.Template.Spec.Containers[0].Args)
	}
}

// enginePolicy: the operator's flags and the admission policy carry the same lists, and the
// chart's own engine repository is always allowed.
func enginePolicy(t *testing.T, defaults []*unstructured.Unstructured) {
	check := func(objs []*unstructured.Unstructured, images string) {
		t.Helper()
		d := kubetest.Typed[appsv1.Deployment](t, kubetest.Find(t, objs, "Deployment", "peregrine-operator"))
		flags := map[string]string{}
		for _, a := range d.Spec.Template.Spec.Containers[0].Args {
			if k, v, ok := strings.Cut(a, "="); ok {
				flags[k] = v
			}
		}
		if flags["--allowed-images"] != images {
			t.Errorf("--allowed-images=%q, want %q", flags["--allowed-images"], images)
		}
		vap := kubetest.Find(t, objs, "ValidatingAdmissionPolicy", "peregrine-serverset-engine-policy")
		vars, _, _ := unstructured.NestedSlice(vap.Object, "spec", "variables")
		byName := map[string]string{}
		for _, v := range vars {
			m := v.(map[string]any)
			byName[m["name"].(string)] = m["expression"].(string)
		}
		for flag, name := range map[string]string{"--allowed-images": "images", "--allowed-host-paths": "hostPaths", "--allowed-devices": "devices"} {
			var l []string
			if err := json.Unmarshal([]byte(byName[name]), &l); err != nil {
				t.Errorf("variable %s %q: %v", name, byName[name], err)
			}
			if strings.Join(l, ",") != flags[flag] {
				t.Errorf("admission policy %s %v, operator %s=%q", name, l, flag, flags[flag])
			}
		}
	}
	check(defaults, "peregrine/engine:,peregrine/engine@")
	check(render(t, "", "--set", "images.engine.repository=registry.example.com/storage/engine,"+
		"operator.enginePolicy.allowedImages={registry.example.com/mirror/}"),
		"registry.example.com/mirror/,registry.example.com/storage/engine:,registry.example.com/storage/engine@")
}

func ptrTrue(b *bool) bool  { return b != nil && *b }
func ptrFalse(b *bool) bool { return b != nil && !*b }
