package e2e

// Suite 7: what deleting leaves behind. A deleted PVC's container is destroyed in the store
// (reclaim Delete); then, opt-in (E2E_UNINSTALL=1, it destroys the install and the suite's store),
// `helm uninstall` of the release leaves no pods, no webhook configuration, no CSIDriver, no CR
// stuck on a finalizer, no FUSE mount under the kubelet's directory and no loop device over the
// ServerSet's emulated device files. It must run last; reinstalling is up to the caller
// (`helm upgrade --install peregrine charts/peregrine -n peregrine-system ...`, as hack/demo.sh).
//
// Environment: E2E_UNINSTALL=1 turns the uninstall on; E2E_HELM names the helm binary (default:
// what hack/build-helm.sh builds, from the repository this test runs in); E2E_RELEASE and
// E2E_RELEASE_NAMESPACE name the release (peregrine, peregrine-system); E2E_KUBELET_DIR the
// kubelet's root directory (/var/lib/kubelet). The host checks (mounts, loop devices) read this
// machine's /proc and /sys, so they run only when the suite runs on the node (the offline
// cluster); on kind the node is a container and they are skipped.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagek8s "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

const driverName = "csi.peregrine.dev"

// cliRuns numbers the pods storeContainers starts.
var cliRuns int

// storeContainers lists the UUIDs of a pool's containers, asked of the management service by the
// engine image's CLI in a one-shot pod (through the ServerSet's headless Service), as an
// administrator would.
func storeContainers(ctx context.Context, pool string) ([]string, error) {
	cliRuns++
	// An administrator's certificate of the store's CA (tls_test.go), unless the store runs
	// without TLS.
	var (
		vols   []corev1.Volume
		mounts []corev1.VolumeMount
		cmd    = []string{"peregrine", "--mgmt", storeMgmt(), "--tls-dir", "/tls", "--json", "cont", "list", pool}
	)
	if storeInsecure(ctx) {
		cmd = append([]string{"/bin/sh", "-c", insecureCLI, "sh"}, cmd[1:3]...)
		cmd = append(cmd, "--json", "cont", "list", pool)
	} else {
		ensureAdminSecret(ctx)
		vols, mounts = tlsVolume(adminTLSSecret)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cont-list-%d", cliRuns), Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "main", Image: engineImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      cmd,
				VolumeMounts: mounts,
			}},
			Volumes: vols,
		},
	}
	if err := k8s.Create(ctx, pod); err != nil {
		return nil, err
	}
	defer func() { _ = k8s.Delete(context.Background(), pod) }()
	deadline := time.Now().Add(2 * time.Minute)
	for pod.Status.Phase != corev1.PodSucceeded {
		if pod.Status.Phase == corev1.PodFailed || time.Now().After(deadline) {
			return nil, fmt.Errorf("pod %s: %s: %s", pod.Name, pod.Status.Phase, podLogs(pod.Name))
		}
		time.Sleep(time.Second)
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod); err != nil {
			return nil, err
		}
	}
	out := podLogs(pod.Name)
	var list struct {
		Containers []struct {
			UUID string `json:"uuid"`
		} `json:"containers"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("cont list: %v: %s", err, out)
	}
	var ids []string
	for _, c := range list.Containers {
		ids = append(ids, c.UUID)
	}
	return ids, nil
}

// helmBinary is E2E_HELM, else hack/build-helm.sh's binary (built once, cached).
func helmBinary() string {
	if h := os.Getenv("E2E_HELM"); h != "" {
		return h
	}
	out, err := exec.Command("bash", "../hack/build-helm.sh").Output()
	Expect(err).NotTo(HaveOccurred(), "hack/build-helm.sh (or set E2E_HELM)")
	return strings.TrimSpace(string(out))
}

// peregrineMounts are the FUSE mounts of Peregrine volumes under the kubelet's directory, from
// this machine's mount table.
func peregrineMounts(kubeletDir string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	Expect(err).NotTo(HaveOccurred())
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [TAGS...] - FSTYPE SOURCE SUPEROPTS
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		fields, rest := strings.Fields(pre), strings.Fields(post)
		if !ok || len(fields) < 5 || len(rest) < 1 {
			continue
		}
		if strings.HasPrefix(rest[0], "fuse.peregrine") && strings.HasPrefix(fields[4], kubeletDir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

// loopsOver are the loop devices whose backing file is under dir (what `losetup -a` shows, read
// from sysfs so that no util-linux is needed).
func loopsOver(dir string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		backing := strings.TrimSpace(string(b))
		if strings.HasPrefix(backing, strings.TrimSuffix(dir, "/")+"/") {
			out = append(out, strings.Split(f, "/")[3]+" over "+backing)
		}
	}
	return out
}

// stuck are the Peregrine CRs being deleted (a deletionTimestamp) that still exist: with the
// operator gone, nothing would ever remove their finalizers.
func stuck(ctx context.Context) []string {
	var out []string
	var sss storagev1.ServerSetList
	Expect(k8s.List(ctx, &sss)).To(Succeed())
	for _, o := range sss.Items {
		if o.DeletionTimestamp != nil {
			out = append(out, "ServerSet "+o.Namespace+"/"+o.Name+" "+fmt.Sprint(o.Finalizers))
		}
	}
	var pools storagev1.PoolList
	Expect(k8s.List(ctx, &pools)).To(Succeed())
	for _, o := range pools.Items {
		if o.DeletionTimestamp != nil {
			out = append(out, "Pool "+o.Namespace+"/"+o.Name+" "+fmt.Sprint(o.Finalizers))
		}
	}
	var conts storagev1.ContainerList
	Expect(k8s.List(ctx, &conts)).To(Succeed())
	for _, o := range conts.Items {
		if o.DeletionTimestamp != nil {
			out = append(out, "Container "+o.Namespace+"/"+o.Name+" "+fmt.Sprint(o.Finalizers))
		}
	}
	return out
}

// gone waits until an object is not found.
func gone(ctx context.Context, obj client.Object, timeout time.Duration) {
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}, timeout).Should(BeTrue(), "%T %s still exists", obj, client.ObjectKeyFromObject(obj))
}

func uninstallSpecs(ctx context.Context) {
	It("destroys the container of a deleted PVC (reclaim Delete)", func() {
		sc := &storagek8s.StorageClass{
			ObjectMeta:  metav1.ObjectMeta{Name: "peregrine-e2e-delete"},
			Provisioner: driverName, Parameters: map[string]string{"pool": poolLabel, "oclass": "S1"},
			ReclaimPolicy: ptr.To(corev1.PersistentVolumeReclaimDelete),
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sc))).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(context.Background(), sc) })
		pvc := &corev1.PersistentVolumeClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "doomed", Namespace: ns},
			Spec: corev1.PersistentVolumeClaimSpec{
				AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				StorageClassName: ptr.To(sc.Name),
				Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
			},
		}
		Expect(k8s.Create(ctx, pvc)).To(Succeed())
		Eventually(func(g Gomega) corev1.PersistentVolumeClaimPhase {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
			return pvc.Status.Phase
		}).Should(Equal(corev1.ClaimBound))
		// Something in it, through a mount, so that deleting also unmounts.
		runPod("doomed-writer", pvc.Name, nil, `echo bye > /data/f && cat /data/f`)
		// The claim is deleted only once no pod uses it (runPod's cleanup comes after the spec).
		writer := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "doomed-writer", Namespace: ns}}
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, writer))).To(Succeed())
		gone(ctx, writer, 2*time.Minute)
		pv := &corev1.PersistentVolume{}
		Expect(k8s.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv)).To(Succeed())
		pool, cont, ok := strings.Cut(pv.Spec.CSI.VolumeHandle, "/")
		Expect(ok).To(BeTrue(), "volume handle %q", pv.Spec.CSI.VolumeHandle)
		Expect(storeContainers(ctx, pool)).To(ContainElement(cont))

		Expect(k8s.Delete(ctx, pvc)).To(Succeed())
		gone(ctx, pv, 2*time.Minute)
		Eventually(func() ([]string, error) { return storeContainers(ctx, pool) }, time.Minute).
			ShouldNot(ContainElement(cont), "container %s of the deleted PVC is still in pool %s", cont, pool)
	})

	It("helm uninstall leaves no pods, webhook, CSIDriver, mounts, CRs on finalizers or loop devices (E2E_UNINSTALL=1)", func() {
		if os.Getenv("E2E_UNINSTALL") != "1" {
			Skip("destroys the install and the suite's store: set E2E_UNINSTALL=1 to run it (last), then reinstall")
		}
		kubeletDir := strings.TrimSuffix(envOr("E2E_KUBELET_DIR", "/var/lib/kubelet"), "/")
		helm := helmBinary()

		// Volumes first, while the driver runs: the suite's PVCs (their pods are gone).
		var pvcs corev1.PersistentVolumeClaimList
		Expect(k8s.List(ctx, &pvcs, client.InNamespace(ns))).To(Succeed())
		for i := range pvcs.Items {
			Expect(client.IgnoreNotFound(k8s.Delete(ctx, &pvcs.Items[i]))).To(Succeed())
		}
		Eventually(func(g Gomega) []string {
			var pvs corev1.PersistentVolumeList
			g.Expect(k8s.List(ctx, &pvs)).To(Succeed())
			var left []string
			for _, pv := range pvs.Items {
				if pv.Spec.CSI != nil && pv.Spec.CSI.Driver == driverName {
					left = append(left, pv.Name+" (claim "+fmt.Sprint(pv.Spec.ClaimRef)+")")
				}
			}
			return left
		}, 3*time.Minute).Should(BeEmpty(), "volumes of %s left (other users' claims would be stranded by the uninstall: delete them first)", driverName)

		// Then the store, while the operator runs (it removes the finalizers): Containers of
		// the pool, the Pool, the ServerSet.
		ss := &storagev1.ServerSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, ss)).To(Succeed())
		emulatedDir := ""
		if ss.Spec.Storage.Emulated != nil {
			emulatedDir = ss.Spec.Storage.Emulated.HostPath
		}
		var conts storagev1.ContainerList
		Expect(k8s.List(ctx, &conts, client.InNamespace(storeNS))).To(Succeed())
		for i := range conts.Items {
			if conts.Items[i].Spec.PoolRef.Name == storeName {
				Expect(client.IgnoreNotFound(k8s.Delete(ctx, &conts.Items[i]))).To(Succeed())
				gone(ctx, &conts.Items[i], 2*time.Minute)
			}
		}
		pool := &storagev1.Pool{ObjectMeta: metav1.ObjectMeta{Namespace: storeNS, Name: storeName}}
		Expect(client.IgnoreNotFound(k8s.Delete(ctx, pool))).To(Succeed())
		gone(ctx, pool, 2*time.Minute)
		Expect(k8s.Delete(ctx, ss)).To(Succeed())
		gone(ctx, ss, 2*time.Minute)

		out, err := exec.Command(helm, "uninstall", release, "-n", releaseNS, "--wait", "--timeout", "5m").CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "helm uninstall:\n%s", out)
		GinkgoWriter.Printf("%s", out)

		Eventually(func(g Gomega) {
			var pods corev1.PodList
			g.Expect(k8s.List(ctx, &pods, client.InNamespace(releaseNS))).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty(), "pods left in %s", releaseNS)
			g.Expect(k8s.List(ctx, &pods, client.MatchingLabels{"app.kubernetes.io/name": "peregrine-engine"})).To(Succeed())
			g.Expect(pods.Items).To(BeEmpty(), "engine pods left")
		}, 3*time.Minute).Should(Succeed())
		_, err = cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "peregrine-webhook", metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the webhook configuration is left: %v", err)
		_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Get(ctx, "peregrine-serverset-engine-policy", metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the admission policy is left: %v", err)
		_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Get(ctx, "peregrine-serverset-engine-policy", metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the admission policy binding is left: %v", err)
		_, err = cs.StorageV1().CSIDrivers().Get(ctx, driverName, metav1.GetOptions{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "the CSIDriver is left: %v", err)
		crs, err := cs.RbacV1().ClusterRoles().List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + release})
		Expect(err).NotTo(HaveOccurred())
		Expect(crs.Items).To(BeEmpty(), "ClusterRoles of the release left")
		Expect(stuck(ctx)).To(BeEmpty(), "CRs stuck on finalizers")

		if _, err := os.Stat(kubeletDir); err != nil {
			GinkgoWriter.Printf("not on the node (%s: %v): mounts and loop devices not checked\n", kubeletDir, err)
			return
		}
		Eventually(func() []string { return peregrineMounts(kubeletDir) }, time.Minute).Should(BeEmpty(), "Peregrine FUSE mounts left")
		if emulatedDir != "" {
			Expect(loopsOver(emulatedDir)).To(BeEmpty(), "loop devices over the ServerSet's device files")
		}
	})
}
