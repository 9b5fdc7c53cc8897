package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagek8s "k8s.io/api/storage/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// The store under test: a ServerSet of three engines on emulated NVMe and a pool on it, in the
// namespace the CSI driver's management address points at (config/csi: tank-0.tank.default.svc).
const (
	storeNS   = "default"
	storeName = "tank"
	poolLabel = "tank"
)

func ready(conds []metav1.Condition) bool {
	return apimeta.IsStatusConditionTrue(conds, storagev1.ConditionReady)
}

// runPod runs a one-shot pod of the tools image with the PVC at /data and returns its log once
// it succeeded (failing the spec if it failed).
func runPod(name, claim string, annotations map[string]string, script string) string {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: annotations},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: toolsImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/bin/sh", "-ec", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	return runPodSpec(pod)
}

// runPodSpec runs pod (restart policy Never) in ns to completion and returns its logs; it fails
// the spec unless the pod succeeded.
func runPodSpec(pod *corev1.Pod) string {
	ctx := context.Background()
	name := pod.Name
	deletePodAndWait(name) // one of a previous run may still be terminating
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	DeferCleanup(func() { _ = k8s.Delete(context.Background(), pod) })
	Eventually(func(g Gomega) corev1.PodPhase {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		return pod.Status.Phase
	}, 10*time.Minute).Should(Or(Equal(corev1.PodSucceeded), Equal(corev1.PodFailed)), "pod %s", name)
	logs := podLogs(name)
	Expect(pod.Status.Phase).To(Equal(corev1.PodSucceeded), "pod %s failed:\n%s", name, logs)
	return logs
}

// expectFuseTransport: on the node (this machine's mounts hold the kubelet's Peregrine
// mounts, as on the offline cluster), the FUSE daemons started since `since` say in their logs,
// in the node plugin's state directory (E2E_CSI_STATE_DIR, the chart's csi.stateDir), that they
// mounted over the transport the chart's default (csi.node.fuseIoUring: auto) picks: FUSE over
// io_uring where this kernel has it, else /dev/fuse. Elsewhere (kind: the node is a container)
// there is nothing to read here.
func expectFuseTransport(since time.Time) {
	if len(peregrineMounts(strings.TrimSuffix(envOr("E2E_KUBELET_DIR", "/var/lib/kubelet"), "/"))) == 0 {
		return
	}
	want := "/dev/fuse)"
	if _, err := os.Stat("/sys/module/fuse/parameters/enable_uring"); err == nil {
		want = "FUSE over io_uring)"
	}
	dir := filepath.Join(envOr("E2E_CSI_STATE_DIR", "/var/lib/peregrine/csi"), "logs")
	// The daemon logs the line once the kernel's INIT is answered, just after the mount.
	Eventually(func(g Gomega) {
		logs, err := filepath.Glob(filepath.Join(dir, "*.log"))
		g.Expect(err).NotTo(HaveOccurred())
		var mounted []string
		for _, l := range logs {
			if fi, err := os.Stat(l); err != nil || fi.ModTime().Before(since) {
				continue
			}
			b, err := os.ReadFile(l)
			g.Expect(err).NotTo(HaveOccurred())
			for _, line := range strings.Split(string(b), "\n") {
				if strings.Contains(line, "peregrine-fuse: mounted ") {
					mounted = append(mounted, line)
				}
			}
		}
		g.Expect(mounted).NotTo(BeEmpty(), "no daemon log in %s says it mounted", dir)
		for _, line := range mounted {
			g.Expect(line).To(HaveSuffix(want))
		}
		GinkgoWriter.Printf("FUSE daemons: %s\n", strings.Join(mounted, "; "))
	}, 10*time.Second).Should(Succeed())
}

func podLogs(name string) string {
	r, err := cs.CoreV1().Pods(ns).GetLogs(name, &corev1.PodLogOptions{}).Stream(context.Background())
	if err != nil {
		return "(no logs: " + err.Error() + ")"
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

var _ = Describe("Peregrine on Kubernetes", Ordered, func() {
	ctx := context.Background()

	It("has the Helm release deployed: operator, webhook, CSI controller and node plugin ready", func() {
		out, err := exec.Command(helmBinary(), "status", release, "-n", releaseNS, "-o", "json").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "helm status %s -n %s (install the chart first: hack/demo.sh does):\n%s", release, releaseNS, out)
		var st struct {
			Info struct{ Status string } `json:"info"`
		}
		Expect(json.Unmarshal(out, &st)).To(Succeed(), "%s", out)
		Expect(st.Info.Status).To(Equal("deployed"))
		Eventually(func(g Gomega) {
			var deps appsv1.DeploymentList
			g.Expect(k8s.List(ctx, &deps, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/instance": release})).To(Succeed())
			g.Expect(deps.Items).NotTo(BeEmpty(), "Deployments of the release")
			for _, d := range deps.Items {
				g.Expect(d.Status.AvailableReplicas).To(Equal(ptr.Deref(d.Spec.Replicas, 1)), "Deployment %s", d.Name)
			}
			var dss appsv1.DaemonSetList
			g.Expect(k8s.List(ctx, &dss, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/instance": release})).To(Succeed())
			g.Expect(dss.Items).NotTo(BeEmpty(), "DaemonSets of the release (the CSI node plugin)")
			for _, d := range dss.Items {
				g.Expect(d.Status.NumberReady).To(Equal(d.Status.DesiredNumberScheduled), "DaemonSet %s", d.Name)
				g.Expect(d.Status.DesiredNumberScheduled).To(BeNumerically(">", 0), "DaemonSet %s", d.Name)
			}
			var drv storagek8s.CSIDriver
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: driverName}, &drv)).To(Succeed())
		}).Should(Succeed())
	})

	It("runs a ServerSet of three engines and a Pool on it", func() {
		ss := &storagev1.ServerSet{
			ObjectMeta: metav1.ObjectMeta{Name: storeName, Namespace: storeNS},
			Spec: storagev1.ServerSetSpec{
				Image: engineImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Engines: 3, Targets: 1,
				Hugepages: ptr.To(resource.MustParse("128Mi")),
				Storage: storagev1.EngineStorage{Scm: "512MiB",
					Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine/e2e", Size: "4GiB"}},
			},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, ss))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ss), ss)).To(Succeed())
			g.Expect(ss.Status.ReadyEngines).To(BeEquivalentTo(3))
			g.Expect(ready(ss.Status.Conditions)).To(BeTrue(), "%v", ss.Status.Conditions)
		}).Should(Succeed())

		// Emulated NVMe needs no privilege: the engines run unprivileged, without escalation,
		// with IPC_LOCK alone (controllers/serverset_render.go engineSecurityContext).
		if ss.Spec.Storage.Emulated != nil {
			pods := &corev1.PodList{}
			Expect(k8s.List(ctx, pods, client.InNamespace(storeNS), client.MatchingLabels{"storage.peregrine.dev/serverset": storeName})).To(Succeed())
			Expect(pods.Items).NotTo(BeEmpty())
			for _, p := range pods.Items {
				sc := p.Spec.Containers[0].SecurityContext
				Expect(sc).NotTo(BeNil(), "pod %s", p.Name)
				Expect(sc.Privileged).To(HaveValue(BeFalse()), "pod %s is privileged", p.Name)
				Expect(sc.AllowPrivilegeEscalation).To(HaveValue(BeFalse()), "pod %s", p.Name)
				Expect(sc.Capabilities.Add).To(ConsistOf(corev1.Capability("IPC_LOCK")), "pod %s", p.Name)
			}
		}

		pool := &storagev1.Pool{
			ObjectMeta: metav1.ObjectMeta{Name: storeName, Namespace: storeNS},
			Spec:       storagev1.PoolSpec{ServerSetRef: storagev1.LocalObjectReference{Name: storeName}, Label: poolLabel, Size: "6GiB"},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, pool))).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
			g.Expect(ready(pool.Status.Conditions)).To(BeTrue(), "%v", pool.Status.Conditions)
			// Every target of the ServerSet (one already there keeps its own spec).
			g.Expect(pool.Status.TotalTargets).To(BeEquivalentTo(ss.Spec.Engines * max(ss.Spec.Targets, 1)))
		}).Should(Succeed())
	})

	It("refuses a ServerSet whose image or host path the operator's configuration does not allow, naming the field", func() {
		for field, mutate := range map[string]func(*storagev1.ServerSet){
			"spec.image":                     func(ss *storagev1.ServerSet) { ss.Spec.Image = "evil.example.com/engine:1" },
			"spec.storage.emulated.hostPath": func(ss *storagev1.ServerSet) { ss.Spec.Storage.Emulated.HostPath = "/etc" },
		} {
			ss := &storagev1.ServerSet{
				ObjectMeta: metav1.ObjectMeta{Name: "e2e-refused", Namespace: ns},
				Spec: storagev1.ServerSetSpec{Image: engineImage, Engines: 1,
					Storage: storagev1.EngineStorage{Scm: "256MiB",
						Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine/e2e", Size: "1GiB"}}},
			}
			mutate(ss)
			err := k8s.Create(ctx, ss, client.DryRunAll)
			Expect(err).To(HaveOccurred(), "the admission policy admitted a bad %s", field)
			Expect(err.Error()).To(ContainSubstring(field + ": Forbidden"))
		}
	})

	It("mounts an RWX PVC into a writer pod and a reader pod: 1 GiB written, its checksum verified", func() {
		sc := &storagek8s.StorageClass{
			ObjectMeta:           metav1.ObjectMeta{Name: "peregrine-e2e"},
			Provisioner:          "csi.peregrine.dev",
			Parameters:           map[string]string{"pool": poolLabel, "oclass": "EC_2P1G1"},
			AllowVolumeExpansion: ptr.To(true),
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sc))).To(Succeed())
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
				StorageClassName: ptr.To(sc.Name),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("2Gi")}},
			},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, pvc))).To(Succeed())
		Eventually(func(g Gomega) corev1.PersistentVolumeClaimPhase {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
			return pvc.Status.Phase
		}).Should(Equal(corev1.ClaimBound))

		runPod("writer", "shared", nil, `
mkdir -p /data/run && cd /data/run
dd if=/dev/urandom of=blob bs=1M count=1024 status=none
sha256sum blob > blob.sha256
df -k /data`)
		logs := runPod("reader", "shared", nil, `cd /data/run && sha256sum -c blob.sha256 && df -k /data`)
		Expect(logs).To(ContainSubstring("blob: OK"))
		// df shows the PVC's size (2 GiB, the container's quota).
		Expect(logs).To(MatchRegexp(`\s2097152\s`))
	})

	It("preloads the interception library into an annotated pod, which reads the same data", func() {
		logs := runPod("intercepted", "shared", map[string]string{
			"peregrine.dev/intercept": "true", "peregrine.dev/intercept-report": "true",
		}, `cd /data/run && sha256sum -c blob.sha256`)
		Expect(logs).To(ContainSubstring("blob: OK"))
		Expect(logs).To(MatchRegexp(`peregrine-il\[\d+\]: intercepted opens=[1-9]\d* reads=[1-9]`), "the report of the library:\n%s", logs)
		var pod corev1.Pod
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: ns, Name: "intercepted"}, &pod)).To(Succeed())
		env := fmt.Sprint(pod.Spec.Containers[0].Env)
		Expect(env).To(ContainSubstring("libperegrine_il.so"))
		Expect(strings.Count(env, "LD_PRELOAD")).To(Equal(1))
		Expect(checkLog(ctx, "intercepted")).To(HavePrefix("peregrine-il: interception on: "))
	})

	interceptCompatSpecs(ctx)

	It("restarts the CSI node plugin under a running pod whose mount keeps working throughout", func() {
		// A pod appends a line every 100 ms and fails at the first failed write or read.
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "steady-writer", Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{
					Name: "main", Image: toolsImage, ImagePullPolicy: corev1.PullIfNotPresent,
					Command: []string{"/bin/sh", "-ec", `mkdir -p /data/steady
i=0; while :; do i=$((i+1)); echo "$i" >> /data/steady/log; tail -n 1 /data/steady/log >/dev/null; sleep 0.1; done`},
					VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
				}},
				Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "shared"}}}},
			},
		}
		deletePodAndWait(pod.Name)
		start := time.Now()
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(context.Background(), pod) })
		Eventually(func(g Gomega) corev1.PodPhase {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
			return pod.Status.Phase
		}).Should(Equal(corev1.PodRunning))
		// Its volume's daemon mounted over the transport the chart's default picks.
		expectFuseTransport(start)

		// Delete the node plugin's pod; the DaemonSet makes another.
		plugins := &corev1.PodList{}
		Expect(k8s.List(ctx, plugins, client.InNamespace("peregrine-system"),
			client.MatchingLabels{"app.kubernetes.io/name": "peregrine-csi-node"})).To(Succeed())
		Expect(plugins.Items).NotTo(BeEmpty())
		old := plugins.Items[0]
		Expect(k8s.Delete(ctx, &old)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8s.List(ctx, plugins, client.InNamespace("peregrine-system"),
				client.MatchingLabels{"app.kubernetes.io/name": "peregrine-csi-node"})).To(Succeed())
			g.Expect(plugins.Items).To(HaveLen(1))
			g.Expect(plugins.Items[0].UID).NotTo(Equal(old.UID))
			g.Expect(plugins.Items[0].Status.ContainerStatuses).NotTo(BeEmpty())
			g.Expect(plugins.Items[0].Status.ContainerStatuses[0].Ready).To(BeTrue())
		}).Should(Succeed())
		// It adopted the running FUSE daemon instead of mounting again.
		Eventually(func() string {
			r, err := cs.CoreV1().Pods("peregrine-system").GetLogs(plugins.Items[0].Name,
				&corev1.PodLogOptions{Container: "peregrine-csi"}).Stream(ctx)
			if err != nil {
				return err.Error()
			}
			defer r.Close()
			b, _ := io.ReadAll(r)
			return string(b)
		}, time.Minute).Should(ContainSubstring("adopted a running peregrine-fuse"))

		// The writer never failed and is still writing.
		time.Sleep(3 * time.Second)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		Expect(pod.Status.Phase).To(Equal(corev1.PodRunning), podLogs(pod.Name))
		Expect(pod.Status.ContainerStatuses[0].RestartCount).To(BeZero())
		logs := runPod("steady-reader", "shared", nil, `wc -l < /data/steady/log`)
		Expect(strings.TrimSpace(logs)).To(MatchRegexp(`^\d{2,}$`))
	})

	controlPlaneSpecs(ctx)
	metricsSpecs(ctx) // before engineRestartSpecs: a restarted engine counts from zero
	engineRestartSpecs(ctx)
	expansionAndSnapshotSpecs(ctx)
	accessControlSpecs(ctx)
	agentSpecs(ctx)
	uninstallSpecs(ctx) // last: E2E_UNINSTALL=1 uninstalls the release
})
