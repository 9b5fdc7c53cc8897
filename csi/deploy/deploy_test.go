package deploy

// The manifests of csi.peregrine.dev: config/csi (the driver) and config/samples/csi, built with
// kustomize as a user builds them (`kubectl kustomize`: sigs.k8s.io/kustomize/api is not in this
// module's graph, and the kubectl of KUBEBUILDER_ASSETS has kustomize built in).
//
// TestWiring checks, without an API server, what makes the driver work on a node and beside its
// sidecars (flags against mounts, host namespaces, privileges, images), the samples against the
// driver's own parsers, and runs the two shell scripts of the DaemonSet with their paths moved
// into a temporary directory. TestApply applies every object to a real kube-apiserver (envtest)
// with server-side apply and strict field validation, so the API server validates each manifest,
// then asks it (SubjectAccessReview) whether the ServiceAccounts may do what the sidecars do.

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	pgv1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/csi"
	"github.com/peregrine-storage/peregrine/csi/webhook"
	"github.com/peregrine-storage/peregrine/internal/kubetest"
)

const (
	baseDir    = "../../config/csi"
	samplesDir = "../../config/samples/csi"

	kubeletDir        = "/var/lib/kubelet"
	pluginsRegistry   = "/var/lib/kubelet/plugins_registry"
	pluginDir         = "/var/lib/kubelet/plugins/" + csi.DriverName
	stateDir          = "/var/lib/peregrine/csi"
	ilSourcePath      = "/usr/lib/peregrine/libperegrine_il.so"
	driverContainer   = "peregrine-csi"
	snapshotGroup     = "snapshot.storage.k8s.io"
	fieldManager      = "peregrine-deploy-test"
	driverImage       = "peregrine/csi:dev"
	mgmtEnv           = "PEREGRINE_MGMT"
	hostCgroupMount   = "/host/sys/fs/cgroup"
	testTimeout       = 60 * time.Second
	sampleNamespace   = "default"
	controllerSAName  = "peregrine-csi-controller"
	nodeSAName        = "peregrine-csi-node"
	controllerDepName = "peregrine-csi-controller"
	nodeDSName        = "peregrine-csi-node"
)

// sidecarImages are the controller pod's sidecars and their images (built locally, issue 18).
var sidecarImages = map[string]string{
	"csi-provisioner": "peregrine/csi-provisioner:v5.3.0",
	"csi-resizer":     "peregrine/csi-resizer:v1.14.0",
	"csi-snapshotter": "peregrine/csi-snapshotter:v8.3.0",
}

// flags parses --name=value / --name arguments; anything else fails the test.
func flags(t *testing.T, who string, args []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, a := range args {
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("%s: argument %q is not a --flag", who, a)
		}
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		if !ok {
			v = "true"
		}
		if _, dup := m[k]; dup {
			t.Fatalf("%s: flag --%s given twice", who, k)
		}
		m[k] = v
	}
	return m
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func volume(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Volume {
	t.Helper()
	for i := range spec.Volumes {
		if spec.Volumes[i].Name == name {
			return &spec.Volumes[i]
		}
	}
	t.Fatalf("no volume %q", name)
	return nil
}

// mountAt returns the mount of c whose mountPath is dir, and its volume.
func mountAt(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, dir string) (*corev1.VolumeMount, *corev1.Volume) {
	t.Helper()
	for i := range c.VolumeMounts {
		if path.Clean(c.VolumeMounts[i].MountPath) == path.Clean(dir) {
			return &c.VolumeMounts[i], volume(t, spec, c.VolumeMounts[i].Name)
		}
	}
	t.Fatalf("container %s mounts nothing at %s", c.Name, dir)
	return nil, nil
}

// hostPathOf fails unless v is a hostPath volume.
func hostPathOf(t *testing.T, v *corev1.Volume) string {
	t.Helper()
	if v.HostPath == nil {
		t.Fatalf("volume %s is not a hostPath", v.Name)
	}
	return path.Clean(v.HostPath.Path)
}

// socketPath strips unix:// from a CSI endpoint.
func socketPath(t *testing.T, endpoint string) string {
	t.Helper()
	p, ok := strings.CutPrefix(endpoint, "unix://")
	if !ok || !path.IsAbs(p) {
		t.Fatalf("endpoint %q: want unix:///absolute/path", endpoint)
	}
	return p
}

// checkHealth: --health-addr's port is the liveness probe's, on /healthz.
func checkHealth(t *testing.T, c *corev1.Container, f map[string]string) {
	t.Helper()
	_, port, err := net.SplitHostPort(f["health-addr"])
	if err != nil || port == "" {
		t.Fatalf("%s: --health-addr %q: %v", c.Name, f["health-addr"], err)
	}
	p := c.LivenessProbe
	if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
		t.Fatalf("%s: want a liveness probe GET /healthz, have %+v", c.Name, p)
	}
	probePort := p.HTTPGet.Port.String()
	for _, cp := range c.Ports {
		if cp.Name == probePort {
			probePort = fmt.Sprint(cp.ContainerPort)
		}
	}
	if probePort != port {
		t.Errorf("%s: liveness probe on port %s, --health-addr on %s", c.Name, probePort, port)
	}
}

// mgmtConfigMap checks that PEREGRINE_MGMT comes from a ConfigMap of the build with a host:port.
func mgmtConfigMap(t *testing.T, objs []*unstructured.Unstructured, c *corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name != mgmtEnv {
			continue
		}
		if e.ValueFrom == nil || e.ValueFrom.ConfigMapKeyRef == nil {
			t.Fatalf("%s: %s is not from a ConfigMap", c.Name, mgmtEnv)
		}
		ref := e.ValueFrom.ConfigMapKeyRef
		cm := kubetest.Typed[corev1.ConfigMap](t, kubetest.Find(t, objs, "ConfigMap", ref.Name))
		v, ok := cm.Data[ref.Key]
		if !ok {
			t.Fatalf("%s: ConfigMap %s has no key %s", c.Name, ref.Name, ref.Key)
		}
		if _, port, err := net.SplitHostPort(v); err != nil || port != "10001" {
			t.Errorf("%s: default %s=%q: want host:10001 (%v)", c.Name, mgmtEnv, v, err)
		}
		return
	}
	t.Fatalf("%s: no %s in env", c.Name, mgmtEnv)
}

// isalName is the ISA-L library the interception library needs beside it.
const isalName = "libisal.so.2"

func TestWiring(t *testing.T) {
	objs := kubetest.Kustomize(t, baseDir)

	t.Run("CSIDriver", func(t *testing.T) {
		d := kubetest.Typed[storagev1.CSIDriver](t, kubetest.Find(t, objs, "CSIDriver", ""))
		s := d.Spec
		if d.Name != csi.DriverName {
			t.Errorf("CSIDriver %q, driver is %q", d.Name, csi.DriverName)
		}
		if s.AttachRequired == nil || *s.AttachRequired {
			t.Errorf("attachRequired must be false (there is no ControllerPublishVolume)")
		}
		if s.PodInfoOnMount == nil || !*s.PodInfoOnMount {
			t.Errorf("podInfoOnMount must be true")
		}
		if fmt.Sprint(s.VolumeLifecycleModes) != "[Persistent Ephemeral]" {
			t.Errorf("volumeLifecycleModes %v", s.VolumeLifecycleModes)
		}
		if s.FSGroupPolicy == nil || *s.FSGroupPolicy != storagev1.FileFSGroupPolicy {
			t.Errorf("fsGroupPolicy must be File")
		}
		if s.RequiresRepublish == nil || *s.RequiresRepublish || s.StorageCapacity == nil || *s.StorageCapacity {
			t.Errorf("requiresRepublish and storageCapacity must be false")
		}
	})

	t.Run("NodeDaemonSet", func(t *testing.T) {
		ds := kubetest.Typed[appsv1.DaemonSet](t, kubetest.Find(t, objs, "DaemonSet", nodeDSName))
		spec := &ds.Spec.Template.Spec
		if !spec.HostPID {
			t.Error("hostPID must be true: FUSE daemons in the pod's own PID namespace die with its container")
		}
		if !spec.HostNetwork || spec.DNSPolicy != corev1.DNSClusterFirstWithHostNet {
			t.Error("want hostNetwork with dnsPolicy ClusterFirstWithHostNet: FUSE daemons must keep their network after the pod goes")
		}
		if spec.ServiceAccountName != nodeSAName {
			t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
		}
		kubetest.Find(t, objs, "ServiceAccount", nodeSAName)
		c := container(t, spec, driverContainer)
		if c.SecurityContext == nil || c.SecurityContext.Privileged == nil || !*c.SecurityContext.Privileged {
			t.Error("the node plugin must be privileged (mounts, /dev/fuse, Bidirectional propagation)")
		}
		if c.Image != driverImage || c.ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("image %s (%s)", c.Image, c.ImagePullPolicy)
		}
		f := flags(t, c.Name, c.Args)
		if f["mode"] != "node" {
			t.Errorf("--mode=%q", f["mode"])
		}

		// The kubelet's directory, at its own path, Bidirectional.
		m, v := mountAt(t, spec, c, kubeletDir)
		if hostPathOf(t, v) != kubeletDir {
			t.Errorf("%s is mounted from %s", kubeletDir, v.HostPath.Path)
		}
		if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Errorf("the mount of %s must have Bidirectional propagation", kubeletDir)
		}

		// Registration socket in the kubelet's plugins_registry.
		reg := f["registration-socket"]
		if !path.IsAbs(reg) {
			t.Fatalf("--registration-socket %q", reg)
		}
		if _, v := mountAt(t, spec, c, path.Dir(reg)); hostPathOf(t, v) != pluginsRegistry {
			t.Errorf("--registration-socket %s: its directory is %s on the host, the kubelet watches %s", reg, v.HostPath.Path, pluginsRegistry)
		}

		// The CSI socket: where the driver listens is where the kubelet dials.
		sock := socketPath(t, f["endpoint"])
		kep := f["kubelet-endpoint"]
		_, v = mountAt(t, spec, c, path.Dir(sock))
		if got := path.Join(hostPathOf(t, v), path.Base(sock)); got != kep {
			t.Errorf("the driver listens on %s (%s on the host), --kubelet-endpoint says %s", sock, got, kep)
		}
		if path.Dir(kep) != pluginDir {
			t.Errorf("--kubelet-endpoint %s: want it in %s", kep, pluginDir)
		}

		// State directory, same path inside and on the host.
		if f["state-dir"] != stateDir {
			t.Errorf("--state-dir %q", f["state-dir"])
		}
		if _, v := mountAt(t, spec, c, stateDir); hostPathOf(t, v) != stateDir {
			t.Errorf("state dir mounted from %s", v.HostPath.Path)
		}

		// /dev/fuse.
		if _, v := mountAt(t, spec, c, "/dev/fuse"); hostPathOf(t, v) != "/dev/fuse" ||
			v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathCharDev {
			t.Errorf("/dev/fuse: want the host's character device")
		}

		checkHealth(t, c, f)
		mgmtConfigMap(t, objs, c)
		nodeName := false
		for _, e := range c.Env {
			if e.Name == "NODE_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "spec.nodeName" {
				nodeName = true
			}
		}
		if !nodeName {
			t.Error("NODE_NAME must come from spec.nodeName (the driver's --node-id)")
		}
		if _, ok := f["fuse-cgroup"]; ok {
			t.Error("--fuse-cgroup is the wrapper's to set")
		}
		if _, v := mountAt(t, spec, c, hostCgroupMount); hostPathOf(t, v) != "/sys/fs/cgroup" {
			t.Errorf("%s mounted from %s", hostCgroupMount, v.HostPath.Path)
		}
	})

	t.Run("FuseCgroupWrapper", func(t *testing.T) {
		ds := kubetest.Typed[appsv1.DaemonSet](t, kubetest.Find(t, objs, "DaemonSet", nodeDSName))
		c := container(t, &ds.Spec.Template.Spec, driverContainer)
		if len(c.Command) != 4 || c.Command[0] != "/bin/sh" || c.Command[1] != "-c" || c.Command[3] != "peregrine-csi" {
			t.Fatalf("command %q: want /bin/sh -c SCRIPT peregrine-csi", c.Command)
		}
		script := c.Command[2]
		if !strings.Contains(script, hostCgroupMount) {
			t.Fatalf("the wrapper does not look in %s", hostCgroupMount)
		}
		tmp := t.TempDir()
		fake := filepath.Join(tmp, "peregrine-csi")
		if err := os.WriteFile(fake, []byte("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		run := func(root string) []string {
			t.Helper()
			s := strings.ReplaceAll(script, hostCgroupMount, root)
			out, err := exec.Command("/bin/sh", append([]string{"-c", s, fake}, c.Args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("wrapper: %v\n%s", err, out)
			}
			got := strings.Split(strings.TrimSpace(string(out)), "\n")
			if len(got) != len(c.Args)+1 || strings.Join(got[:len(c.Args)], " ") != strings.Join(c.Args, " ") {
				t.Fatalf("wrapper passed %q, want the args %q and --fuse-cgroup", got, c.Args)
			}
			v, ok := strings.CutPrefix(got[len(c.Args)], "--fuse-cgroup=")
			if !ok {
				t.Fatalf("wrapper's last argument %q", got[len(c.Args)])
			}
			return strings.Split(v, ",") // as the driver splits it
		}
		mk := func(p ...string) {
			if err := os.MkdirAll(filepath.Join(p...), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		touch := func(p ...string) {
			if err := os.WriteFile(filepath.Join(p...), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		// cgroup v1 as Debian mounts it: hierarchies, links to the combined ones, the unified one.
		v1 := filepath.Join(tmp, "v1")
		for _, h := range []string{"cpu,cpuacct", "devices", "freezer", "pids", "unified", "systemd"} {
			mk(v1, h)
			touch(v1, h, "cgroup.procs")
		}
		if err := os.Symlink("cpu,cpuacct", filepath.Join(v1, "cpu")); err != nil {
			t.Fatal(err)
		}
		mk(v1, "not-a-cgroup")
		want := []string{}
		for _, h := range []string{"cpu", "devices", "freezer", "pids", "systemd", "unified"} {
			want = append(want, filepath.Join(v1, h, "peregrine-fuse"))
		}
		if got := run(v1); strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("cgroup v1: --fuse-cgroup %q, want %q", got, want)
		}
		v2 := filepath.Join(tmp, "v2")
		mk(v2, "kubepods")
		touch(v2, "cgroup.controllers")
		touch(v2, "cgroup.procs")
		if got := run(v2); len(got) != 1 || got[0] != filepath.Join(v2, "peregrine-fuse") {
			t.Errorf("cgroup v2: --fuse-cgroup %q", got)
		}
	})

	t.Run("InterceptionLibrary", func(t *testing.T) {
		ds := kubetest.Typed[appsv1.DaemonSet](t, kubetest.Find(t, objs, "DaemonSet", nodeDSName))
		spec := &ds.Spec.Template.Spec
		if len(spec.InitContainers) != 1 {
			t.Fatalf("want one init container (install-il), have %d", len(spec.InitContainers))
		}
		ic := &spec.InitContainers[0]
		if ic.Image != driverImage {
			t.Errorf("install-il image %s: the library comes with the driver's image", ic.Image)
		}
		// The webhook mounts webhook.DefaultHostDir into pods: the init container fills it.
		var dst string
		for _, m := range ic.VolumeMounts {
			if v := volume(t, spec, m.Name); v.HostPath != nil && path.Clean(v.HostPath.Path) == webhook.DefaultHostDir {
				dst = m.MountPath
			}
		}
		if dst == "" {
			t.Fatalf("install-il mounts no hostPath %s", webhook.DefaultHostDir)
		}
		if len(ic.Command) != 3 || ic.Command[0] != "/bin/sh" || ic.Command[1] != "-c" {
			t.Fatalf("install-il command %q", ic.Command)
		}
		script := ic.Command[2]
		if !strings.Contains(script, path.Dir(ilSourcePath)) || !strings.Contains(script, dst) ||
			!strings.Contains(script, webhook.LibraryName) || !strings.Contains(script, isalName) ||
			!strings.Contains(script, webhook.CheckerName) {
			t.Fatalf("install-il script does not copy %s, its %s and %s to %s:\n%s", ilSourcePath, isalName, webhook.CheckerName, dst, script)
		}
		// Run it with both paths in a temporary directory, over an old library held open.
		tmp := t.TempDir()
		src, hostDir := filepath.Join(tmp, "src"), filepath.Join(tmp, "il")
		for _, d := range []string{src, hostDir} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		lib := filepath.Join(hostDir, webhook.LibraryName)
		if err := os.WriteFile(filepath.Join(src, webhook.LibraryName), []byte("new"), 0o644); err != nil {
			t.Fatal(err)
		}
		// The library's ISA-L goes beside it (it is linked with RUNPATH $ORIGIN).
		if err := os.WriteFile(filepath.Join(src, isalName), []byte("isal"), 0o644); err != nil {
			t.Fatal(err)
		}
		// The check containers' checker too (csi/ilcheck).
		if err := os.WriteFile(filepath.Join(src, webhook.CheckerName), []byte("check"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(lib, []byte("old"), 0o755); err != nil {
			t.Fatal(err)
		}
		old, err := os.Open(lib)
		if err != nil {
			t.Fatal(err)
		}
		defer old.Close()
		s := strings.ReplaceAll(strings.ReplaceAll(script, path.Dir(ilSourcePath), src), dst, hostDir)
		if out, err := exec.Command("/bin/sh", "-c", s).CombinedOutput(); err != nil {
			t.Fatalf("install-il: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(lib); err != nil || string(b) != "new" {
			t.Fatalf("installed library: %q, %v", b, err)
		}
		if b, _ := io.ReadAll(old); string(b) != "old" {
			t.Errorf("the library was rewritten in place (a process mapping it would see %q): want a rename", b)
		}
		if fi, err := os.Stat(lib); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("installed library mode: %v %v", fi.Mode(), err)
		}
		if b, err := os.ReadFile(filepath.Join(hostDir, isalName)); err != nil || string(b) != "isal" {
			t.Errorf("installed %s: %q, %v", isalName, b, err)
		}
		if b, err := os.ReadFile(filepath.Join(hostDir, webhook.CheckerName)); err != nil || string(b) != "check" {
			t.Errorf("installed %s: %q, %v", webhook.CheckerName, b, err)
		}
		if ents, _ := os.ReadDir(hostDir); len(ents) != 3 {
			t.Errorf("leftovers in the library directory: %v", ents)
		}
	})

	t.Run("ControllerDeployment", func(t *testing.T) {
		dep := kubetest.Typed[appsv1.Deployment](t, kubetest.Find(t, objs, "Deployment", controllerDepName))
		spec := &dep.Spec.Template.Spec
		if spec.ServiceAccountName != controllerSAName {
			t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
		}
		kubetest.Find(t, objs, "ServiceAccount", controllerSAName)
		d := container(t, spec, driverContainer)
		df := flags(t, d.Name, d.Args)
		if df["mode"] != "controller" {
			t.Errorf("--mode=%q", df["mode"])
		}
		if d.Image != driverImage {
			t.Errorf("driver image %s", d.Image)
		}
		checkHealth(t, d, df)
		mgmtConfigMap(t, objs, d)
		sock := socketPath(t, df["endpoint"])
		_, sockVol := mountAt(t, spec, d, path.Dir(sock))
		if sockVol.EmptyDir == nil {
			t.Errorf("the socket's volume %s should be an emptyDir of the pod", sockVol.Name)
		}
		if len(spec.Containers) != 1+len(sidecarImages) {
			t.Errorf("%d containers, want the driver and %d sidecars", len(spec.Containers), len(sidecarImages))
		}
		for name, image := range sidecarImages {
			c := container(t, spec, name)
			if c.Image != image {
				t.Errorf("%s: image %s, want %s", name, c.Image, image)
			}
			f := flags(t, name, c.Args)
			addr := strings.TrimPrefix(f["csi-address"], "unix://")
			if addr != sock {
				t.Errorf("%s: --csi-address %q, the driver listens on %s", name, f["csi-address"], sock)
			}
			if m, v := mountAt(t, spec, c, path.Dir(addr)); v.Name != sockVol.Name {
				t.Errorf("%s: %s is volume %s, the driver's socket is in %s", name, m.MountPath, v.Name, sockVol.Name)
			}
			if f["leader-election"] != "true" {
				t.Errorf("%s: no --leader-election", name)
			}
		}
		pf := flags(t, "csi-provisioner", container(t, spec, "csi-provisioner").Args)
		if pf["extra-create-metadata"] != "true" || pf["feature-gates"] != "Topology=false" {
			t.Errorf("csi-provisioner flags %v", pf)
		}
		for _, c := range spec.Containers {
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s: imagePullPolicy %s", c.Name, c.ImagePullPolicy)
			}
		}
	})

	t.Run("RBACReferences", func(t *testing.T) {
		for _, o := range objs {
			var ref rbacv1.RoleRef
			var subjects []rbacv1.Subject
			switch o.GetKind() {
			case "ClusterRoleBinding":
				b := kubetest.Typed[rbacv1.ClusterRoleBinding](t, o)
				ref, subjects = b.RoleRef, b.Subjects
			case "RoleBinding":
				b := kubetest.Typed[rbacv1.RoleBinding](t, o)
				ref, subjects = b.RoleRef, b.Subjects
			default:
				continue
			}
			kubetest.Find(t, objs, ref.Kind, ref.Name)
			for _, s := range subjects {
				sa := kubetest.Find(t, objs, "ServiceAccount", s.Name)
				if s.Kind != "ServiceAccount" || s.Namespace != sa.GetNamespace() {
					t.Errorf("%s %s: subject %+v", o.GetKind(), o.GetName(), s)
				}
			}
		}
	})

	t.Run("Samples", func(t *testing.T) {
		samples := kubetest.Kustomize(t, samplesDir)
		sc := kubetest.Typed[storagev1.StorageClass](t, kubetest.Find(t, samples, "StorageClass", ""))
		if sc.Provisioner != csi.DriverName || sc.AllowVolumeExpansion == nil || !*sc.AllowVolumeExpansion {
			t.Errorf("StorageClass: provisioner %s, allowVolumeExpansion %v", sc.Provisioner, sc.AllowVolumeExpansion)
		}
		if _, err := csi.ParseParams(sc.Parameters, ""); err != nil {
			t.Errorf("StorageClass parameters: the driver refuses them: %v", err)
		}
		if len(sc.MountOptions) == 0 {
			t.Error("StorageClass: no mountOptions example")
		}
		pvc := kubetest.Typed[corev1.PersistentVolumeClaim](t, kubetest.Find(t, samples, "PersistentVolumeClaim", "peregrine-data"))
		if pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != sc.Name {
			t.Errorf("PVC %s: storageClassName %v", pvc.Name, pvc.Spec.StorageClassName)
		}

		pod := kubetest.Typed[corev1.Pod](t, kubetest.Find(t, samples, "Pod", "peregrine-reader"))
		if pod.Annotations[webhook.AnnotationIntercept] != "true" {
			t.Errorf("pod %s: no %s: \"true\"", pod.Name, webhook.AnnotationIntercept)
		}
		subPath := false
		for _, v := range pod.Spec.Volumes {
			if v.PersistentVolumeClaim == nil || v.PersistentVolumeClaim.ClaimName != pvc.Name {
				continue
			}
			for _, c := range pod.Spec.Containers {
				for _, m := range c.VolumeMounts {
					subPath = subPath || (m.Name == v.Name && m.SubPath != "")
				}
			}
		}
		if !subPath {
			t.Errorf("pod %s: no subPath mount of PVC %s", pod.Name, pvc.Name)
		}

		eph := kubetest.Typed[corev1.Pod](t, kubetest.Find(t, samples, "Pod", "peregrine-scratch"))
		inline := 0
		for _, v := range eph.Spec.Volumes {
			if v.CSI == nil {
				continue
			}
			inline++
			if v.CSI.Driver != csi.DriverName {
				t.Errorf("inline volume driver %s", v.CSI.Driver)
			}
			params := map[string]string{}
			for k, val := range v.CSI.VolumeAttributes {
				if k == "size" { // CreateEphemeral's quota; the rest are StorageClass parameters
					if _, err := pgv1.Size(val).Bytes(); err != nil {
						t.Errorf("inline volume size %q: %v", val, err)
					}
					continue
				}
				params[k] = val
			}
			if _, err := csi.ParseParams(params, ""); err != nil {
				t.Errorf("inline volume attributes: the driver refuses them: %v", err)
			}
		}
		if inline != 1 {
			t.Errorf("pod %s: %d inline CSI volumes", eph.Name, inline)
		}

		pv := kubetest.Typed[corev1.PersistentVolume](t, kubetest.Find(t, samples, "PersistentVolume", ""))
		if pv.Spec.CSI == nil || pv.Spec.CSI.Driver != csi.DriverName {
			t.Fatalf("static PV %s: not a %s volume", pv.Name, csi.DriverName)
		}
		if id, err := csi.ParseVolumeID(pv.Spec.CSI.VolumeHandle); err != nil || id.String() != "tank/existing-container" {
			t.Errorf("static PV volumeHandle %q: %v", pv.Spec.CSI.VolumeHandle, err)
		}
		static := kubetest.Typed[corev1.PersistentVolumeClaim](t, kubetest.Find(t, samples, "PersistentVolumeClaim", pv.Name))
		if static.Spec.VolumeName != pv.Name || pv.Spec.ClaimRef == nil || pv.Spec.ClaimRef.Name != static.Name {
			t.Errorf("static PV %s and PVC %s do not name each other", pv.Name, static.Name)
		}

		// Snapshot kinds: their CRDs are not installed in TestApply, so their references are
		// checked here.
		vsc := kubetest.Find(t, samples, "VolumeSnapshotClass", "")
		if drv, _, _ := unstructured.NestedString(vsc.Object, "driver"); drv != csi.DriverName {
			t.Errorf("VolumeSnapshotClass driver %q", drv)
		}
		vs := kubetest.Find(t, samples, "VolumeSnapshot", "")
		if cls, _, _ := unstructured.NestedString(vs.Object, "spec", "volumeSnapshotClassName"); cls != vsc.GetName() {
			t.Errorf("VolumeSnapshot class %q", cls)
		}
		if src, _, _ := unstructured.NestedString(vs.Object, "spec", "source", "persistentVolumeClaimName"); src != pvc.Name {
			t.Errorf("VolumeSnapshot source %q", src)
		}
		restored := kubetest.Typed[corev1.PersistentVolumeClaim](t, kubetest.Find(t, samples, "PersistentVolumeClaim", "peregrine-data-restored"))
		ds := restored.Spec.DataSource
		if ds == nil || ds.APIGroup == nil || *ds.APIGroup != snapshotGroup || ds.Kind != "VolumeSnapshot" || ds.Name != vs.GetName() {
			t.Errorf("restored PVC dataSource %+v", ds)
		}
		if restored.Spec.Resources.Requests.Storage().Cmp(*pvc.Spec.Resources.Requests.Storage()) < 0 {
			t.Errorf("restored PVC smaller than the snapshot's source")
		}
	})
}

// applyAll applies Namespaces first, then the rest in the build's order.
func applyAll(ctx context.Context, t *testing.T, c client.Client, objs []*unstructured.Unstructured) {
	t.Helper()
	sorted := append([]*unstructured.Unstructured(nil), objs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return sorted[i].GetKind() == "Namespace" && sorted[j].GetKind() != "Namespace"
	})
	for _, o := range sorted {
		if err := kubetest.Apply(ctx, c, o, fieldManager); err != nil {
			t.Errorf("apply %s %s/%s: %v", o.GetKind(), o.GetNamespace(), o.GetName(), err)
		}
	}
}

// access is one request a sidecar makes.
type access struct {
	group, resource, subresource, verb string
	namespace                          string // "" for cluster-scoped or any namespace
}

func (a access) String() string {
	r := a.resource
	if a.group != "" {
		r += "." + a.group
	}
	if a.subresource != "" {
		r += "/" + a.subresource
	}
	if a.namespace != "" {
		r += " in " + a.namespace
	}
	return a.verb + " " + r
}

func accesses(group, resource string, verbs ...string) []access {
	var out []access
	sub := ""
	if r, s, ok := strings.Cut(resource, "/"); ok {
		resource, sub = r, s
	}
	for _, v := range verbs {
		out = append(out, access{group: group, resource: resource, subresource: sub, verb: v})
	}
	return out
}

func allowed(ctx context.Context, t *testing.T, c client.Client, user string, a access) bool {
	t.Helper()
	ns, _, _ := strings.Cut(strings.TrimPrefix(user, "system:serviceaccount:"), ":")
	sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
		User:   user,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"},
		ResourceAttributes: &authorizationv1.ResourceAttributes{
			Group: a.group, Resource: a.resource, Subresource: a.subresource, Verb: a.verb, Namespace: a.namespace,
		},
	}}
	if err := c.Create(ctx, sar); err != nil {
		t.Fatalf("SubjectAccessReview: %v", err)
	}
	return sar.Status.Allowed
}

func TestApply(t *testing.T) {
	base := kubetest.Kustomize(t, baseDir)
	samples := kubetest.Kustomize(t, samplesDir)
	c := kubetest.StartEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	applyAll(ctx, t, c, base)
	var toApply []*unstructured.Unstructured
	for _, o := range samples {
		if o.GroupVersionKind().Group == snapshotGroup {
			// No snapshot CRDs in envtest: the kinds come from external-snapshotter, which this
			// module does not depend on, and a hand-written CRD would only validate itself.
			// TestWiring/Samples checks their references instead.
			t.Logf("not applied (no %s CRDs): %s %s", snapshotGroup, o.GetKind(), o.GetName())
			continue
		}
		toApply = append(toApply, o)
	}
	// Pods need their ServiceAccount; with no controller-manager nobody makes "default".
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: sampleNamespace}}
	if err := c.Create(ctx, sa); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, o := range toApply {
		if o.GetNamespace() == "" && o.GetKind() != "StorageClass" && o.GetKind() != "PersistentVolume" {
			o.SetNamespace(sampleNamespace)
		}
	}
	applyAll(ctx, t, c, toApply)
	if t.Failed() {
		return
	}

	// What the server stored keeps the fields the driver depends on.
	t.Run("Stored", func(t *testing.T) {
		ns := kubetest.Find(t, base, "DaemonSet", nodeDSName).GetNamespace()
		ds := &appsv1.DaemonSet{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeDSName}, ds); err != nil {
			t.Fatal(err)
		}
		spec := &ds.Spec.Template.Spec
		cont := container(t, spec, driverContainer)
		m, _ := mountAt(t, spec, cont, kubeletDir)
		if !spec.HostPID || !*cont.SecurityContext.Privileged || *m.MountPropagation != corev1.MountPropagationBidirectional {
			t.Error("the stored DaemonSet lost hostPID, privileged or Bidirectional")
		}
		d := &storagev1.CSIDriver{}
		if err := c.Get(ctx, client.ObjectKey{Name: csi.DriverName}, d); err != nil {
			t.Fatal(err)
		}
		if *d.Spec.AttachRequired {
			t.Error("stored CSIDriver: attachRequired true")
		}
	})

	// The API server refuses a node plugin without privileges (Bidirectional needs them), and
	// an unknown field: the apply above was validated, not waved through.
	t.Run("ValidationIsReal", func(t *testing.T) {
		u := kubetest.Find(t, base, "DaemonSet", nodeDSName).DeepCopy()
		u.SetName("peregrine-csi-node-unprivileged")
		ds := kubetest.Typed[appsv1.DaemonSet](t, u)
		container(t, &ds.Spec.Template.Spec, driverContainer).SecurityContext.Privileged = nil
		obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ds)
		if err != nil {
			t.Fatal(err)
		}
		bad := &unstructured.Unstructured{Object: obj}
		bad.SetGroupVersionKind(u.GroupVersionKind())
		unstructured.RemoveNestedField(bad.Object, "metadata", "creationTimestamp")
		unstructured.RemoveNestedField(bad.Object, "status")
		if err := kubetest.Apply(ctx, c, bad, fieldManager); err == nil || !strings.Contains(err.Error(), "Bidirectional") {
			t.Errorf("unprivileged Bidirectional DaemonSet: want a refusal about Bidirectional, got %v", err)
		}
		u = kubetest.Find(t, base, "CSIDriver", "").DeepCopy()
		u.SetName("typo.peregrine.dev")
		if err := unstructured.SetNestedField(u.Object, true, "spec", "attachRequird"); err != nil {
			t.Fatal(err)
		}
		if err := kubetest.Apply(ctx, c, u, fieldManager); err == nil {
			t.Error("an unknown field was accepted")
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		ns := kubetest.Find(t, base, "ServiceAccount", controllerSAName).GetNamespace()
		ctrlUser := "system:serviceaccount:" + ns + ":" + controllerSAName
		nodeUser := "system:serviceaccount:" + kubetest.Find(t, base, "ServiceAccount", nodeSAName).GetNamespace() + ":" + nodeSAName
		events := accesses("", "events", "list", "watch", "create", "update", "patch")
		var need []access
		// external-provisioner v5.3.0 (deploy/kubernetes/rbac.yaml, capacity rules left out).
		need = append(need, accesses("", "persistentvolumes", "get", "list", "watch", "create", "patch", "delete")...)
		need = append(need, accesses("", "persistentvolumeclaims", "get", "list", "watch", "update")...)
		need = append(need, accesses("storage.k8s.io", "storageclasses", "get", "list", "watch")...)
		need = append(need, events...)
		need = append(need, accesses(snapshotGroup, "volumesnapshots", "get", "list")...)
		need = append(need, accesses(snapshotGroup, "volumesnapshotcontents", "get", "list")...)
		need = append(need, accesses("storage.k8s.io", "csinodes", "get", "list", "watch")...)
		need = append(need, accesses("", "nodes", "get", "list", "watch")...)
		need = append(need, accesses("storage.k8s.io", "volumeattachments", "get", "list", "watch")...)
		// external-resizer v1.14.0.
		need = append(need, accesses("", "persistentvolumes", "patch")...)
		need = append(need, accesses("", "pods", "get", "list", "watch")...)
		need = append(need, accesses("", "persistentvolumeclaims/status", "patch")...)
		need = append(need, accesses("storage.k8s.io", "volumeattributesclasses", "get", "list", "watch")...)
		// csi-snapshotter v8.3.0.
		need = append(need, accesses(snapshotGroup, "volumesnapshotclasses", "get", "list", "watch")...)
		need = append(need, accesses(snapshotGroup, "volumesnapshotcontents", "watch", "update", "patch")...)
		need = append(need, accesses(snapshotGroup, "volumesnapshotcontents/status", "update", "patch")...)
		// Leader election of all three, in the pod's namespace.
		for _, a := range accesses("coordination.k8s.io", "leases", "get", "list", "watch", "create", "update", "delete") {
			a.namespace = ns
			need = append(need, a)
		}
		for _, a := range need {
			if !allowed(ctx, t, c, ctrlUser, a) {
				t.Errorf("controller ServiceAccount may not %s", a)
			}
		}
		// And no more than that, where it matters.
		for _, a := range []access{
			{resource: "secrets", verb: "get"},
			{group: "coordination.k8s.io", resource: "leases", verb: "create", namespace: "kube-system"},
			{resource: "persistentvolumeclaims", verb: "delete"},
		} {
			if allowed(ctx, t, c, ctrlUser, a) {
				t.Errorf("controller ServiceAccount may %s", a)
			}
		}
		for _, a := range []access{{resource: "nodes", verb: "get"}, {resource: "pods", verb: "list"}} {
			if allowed(ctx, t, c, nodeUser, a) {
				t.Errorf("node ServiceAccount may %s", a)
			}
		}
		sa := &corev1.ServiceAccount{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: nodeSAName}, sa); err != nil {
			t.Fatal(err)
		}
		if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
			t.Error("node ServiceAccount mounts a token it never uses")
		}
	})
}
