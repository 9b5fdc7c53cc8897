package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Suite 6: a PVC expanded while a pod has it mounted, then snapshotted and restored into a new PVC.
// It uses a PVC of its own ("resize"), so "shared" keeps its size for the other suites.
//
// VolumeSnapshots are unstructured objects: the snapshot client module would be a dependency of
// the whole repository for three small types. They need the cluster's snapshot add-on (the
// snapshot.storage.k8s.io CRDs and the snapshot-controller: hack/snapshot-addon.sh install), as
// managed clusters provide.

const (
	resizePVC   = "resize"
	restoredPVC = "resize-restored"
	snapName    = "resize-snap"
	snapClass   = "peregrine-e2e"
	// The sizes df reports, in KiB: 64 MiB before and 512 MiB after the expansion.
	sizeBefore = "64Mi"
	sizeAfter  = "512Mi"
)

var (
	snapshotGV          = schema.GroupVersion{Group: "snapshot.storage.k8s.io", Version: "v1"}
	volumeSnapshotGVK   = snapshotGV.WithKind("VolumeSnapshot")
	snapshotClassGVK    = snapshotGV.WithKind("VolumeSnapshotClass")
	snapshotContentsGVK = snapshotGV.WithKind("VolumeSnapshotContent")
	// Pods of this suite, deleted before the PVCs they mount.
	snapshotPods = []string{"resize-watch", "snap-writer", "snap-overwriter", "snap-reader", "snap-source-reader"}
)

func newUnstructured(gvk schema.GroupVersionKind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// deleteAndWait deletes obj if it exists and waits until the API server no longer has it: an
// object of the same name left by a previous run (a pod still terminating, a PVC held by its
// protection finalizer, a VolumeSnapshot whose content is being deleted) would make the next
// Create fail with AlreadyExists.
func deleteAndWait(ctx context.Context, obj client.Object) {
	err := k8s.Delete(ctx, obj, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if apierrors.IsNotFound(err) {
		return
	}
	Expect(err).To(Succeed(), "delete %T %s", obj, obj.GetName())
	Eventually(func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}).Should(BeTrue(), "%T %s/%s still there", obj, obj.GetNamespace(), obj.GetName())
}

// deletePodAndWait is deleteAndWait for a pod of this run's namespace.
func deletePodAndWait(name string) {
	deleteAndWait(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}})
}

// startPod starts a long-running pod of the tools image with the PVC at /data and returns once
// it runs. The script should trap TERM: a shell as PID 1 ignores it, and the pod would take its
// whole grace period to stop.
func startPod(name, claim, script string) *corev1.Pod {
	ctx := context.Background()
	deletePodAndWait(name)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](10),
			Containers: []corev1.Container{{
				Name: "main", Image: toolsImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/bin/sh", "-ec", script},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
	Expect(k8s.Create(ctx, pod)).To(Succeed())
	DeferCleanup(deletePodAndWait, name)
	Eventually(func(g Gomega) corev1.PodPhase {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		return pod.Status.Phase
	}).Should(Equal(corev1.PodRunning), "pod %s", name)
	return pod
}

// expectRunning, inside an Eventually, fails the spec at once when a long-running pod stopped
// (its script failed): no waiting can make it run again.
func expectRunning(g Gomega, name string) {
	var pod corev1.Pod
	g.Expect(k8s.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: name}, &pod)).To(Succeed())
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		StopTrying(fmt.Sprintf("pod %s stopped (%s):\n%s", name, pod.Status.Phase, podLogs(name))).Now()
	}
}

func newPVC(name, size string, source *corev1.TypedLocalObjectReference) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To("peregrine-e2e"),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse(size)}},
			DataSource:       source,
		},
	}
}

func waitBound(ctx context.Context, pvc *corev1.PersistentVolumeClaim) {
	Eventually(func(g Gomega) corev1.PersistentVolumeClaimPhase {
		g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
		return pvc.Status.Phase
	}).Should(Equal(corev1.ClaimBound), "PVC %s", pvc.Name)
}

// removeSnapshotObjects deletes what suite 6 makes, users before what they use: the pods, the
// restored PVC, the snapshot (its content and the store's snapshot go with it, deletionPolicy
// Delete), then the source PVC, whose container the driver deletes only once it has no snapshot.
func removeSnapshotObjects(ctx context.Context) {
	for _, p := range snapshotPods {
		deletePodAndWait(p)
	}
	deleteAndWait(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: restoredPVC, Namespace: ns}})
	if snapshotsInstalled() {
		deleteAndWait(ctx, newUnstructured(volumeSnapshotGVK, ns, snapName))
	}
	deleteAndWait(ctx, &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: resizePVC, Namespace: ns}})
}

func snapshotsInstalled() bool {
	_, err := k8s.RESTMapper().RESTMapping(volumeSnapshotGVK.GroupKind(), snapshotGV.Version)
	return err == nil
}

// shaLines maps file names to checksums in sha256sum output (lines "<64 hex>  <name>").
func shaLines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range regexp.MustCompile(`(?m)^([0-9a-f]{64})  (\S+)$`).FindAllStringSubmatch(out, -1) {
		m[l[2]] = l[1]
	}
	return m
}

// section returns the lines of out between a line "== name" and the next "== " line.
func section(out, name string) string {
	_, rest, ok := strings.Cut(out, "== "+name+"\n")
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, "== ")
	return body
}

func expansionAndSnapshotSpecs(ctx context.Context) {
	It("expands a mounted PVC online: the running pod's df, the PVC's capacity and the quota the store enforces all grow", func() {
		removeSnapshotObjects(ctx)
		pvc := newPVC(resizePVC, sizeBefore, nil)
		Expect(k8s.Create(ctx, pvc)).To(Succeed())
		waitBound(ctx, pvc)

		// The pod checks the old quota (a write past it is refused), then waits, mounted, until its
		// df shows a new size, and writes past the old one. Its log says how far it got. The
		// engines of a ServerSet run in pods of their own and learn what the others store once a
		// second (README, Size), so a write can pass the quota by what it stores meanwhile: the
		// file grows 8 MiB at a time until refused, at most 256 MiB.
		startPod("resize-watch", resizePVC, `trap 'exit 0' TERM
size() { df -k /data | awk 'NR == 2 {print $2}'; }
echo "size $(size)"
mkdir -p /data/fill
n=0
while [ $n -lt 32 ] && dd if=/dev/urandom of=/data/fill/over bs=1M count=8 oflag=append conv=notrunc status=none 2>/tmp/err; do
  n=$((n + 1))
done
echo "write past the quota: refused after $((n * 8)) MiB: $(cat /tmp/err)"
rm -f /data/fill/over
echo "waiting for the expansion"
while [ "$(size)" = 65536 ]; do sleep 0.5; done
echo "size $(size)"
dd if=/dev/urandom of=/data/fill/big bs=1M count=96 status=none
echo "write past the old size: ok"
rm -rf /data/fill
while :; do sleep 0.5; done`)
		Eventually(func(g Gomega) string {
			expectRunning(g, "resize-watch")
			return podLogs("resize-watch")
		}).Should(ContainSubstring("waiting for the expansion"))
		logs := podLogs("resize-watch")
		Expect(logs).To(ContainSubstring("size 65536\n"))
		Expect(logs).To(MatchRegexp(`write past the quota: refused after \d+ MiB: .*Disk quota exceeded`))
		GinkgoWriter.Println(regexp.MustCompile(`write past the quota: refused after \d+ MiB`).FindString(logs), "(quota 64 MiB)")

		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
		patch := client.MergeFrom(pvc.DeepCopy())
		pvc.Spec.Resources.Requests[corev1.ResourceStorage] = resource.MustParse(sizeAfter)
		Expect(k8s.Patch(ctx, pvc, patch)).To(Succeed())

		Eventually(func(g Gomega) string {
			expectRunning(g, "resize-watch")
			return podLogs("resize-watch")
		}).Should(ContainSubstring("write past the old size: ok"))
		Expect(podLogs("resize-watch")).To(ContainSubstring("size 524288\n"))
		// The resizer reports the new size once the controller expanded the volume; no node step.
		want := resource.MustParse(sizeAfter)
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc)).To(Succeed())
			got := pvc.Status.Capacity[corev1.ResourceStorage]
			g.Expect(got.Cmp(want)).To(Equal(0), "status.capacity %s", got.String())
			g.Expect(pvc.Status.Conditions).To(BeEmpty(), "resize conditions left")
			var pv corev1.PersistentVolume
			g.Expect(k8s.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, &pv)).To(Succeed())
			got = pv.Spec.Capacity[corev1.ResourceStorage]
			g.Expect(got.Cmp(want)).To(Equal(0), "PV capacity %s", got.String())
		}).Should(Succeed())
	})

	It("snapshots a PVC and restores the snapshot into a new PVC holding exactly the data as of the snapshot", func() {
		DeferCleanup(removeSnapshotObjects, ctx)
		Expect(snapshotsInstalled()).To(BeTrue(),
			"the cluster has no snapshot.storage.k8s.io/v1 VolumeSnapshot: install the snapshot add-on (hack/snapshot-addon.sh install)")
		class := newUnstructured(snapshotClassGVK, "", snapClass)
		class.Object["driver"] = "csi.peregrine.dev"
		class.Object["deletionPolicy"] = "Delete"
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, class))).To(Succeed())

		// What the snapshot must hold: files of several sizes, a directory, and their checksums.
		wrote := runPod("snap-writer", resizePVC, nil, `mkdir -p /data/snap/dir && cd /data/snap
dd if=/dev/urandom of=a.bin bs=1M count=16 status=none
dd if=/dev/urandom of=b.bin bs=64k count=100 status=none
echo "as of the snapshot" > dir/note
sha256sum a.bin b.bin dir/note > /data/at-snapshot.sha256
echo "== sums"; cat /data/at-snapshot.sha256
echo "== files"; cd /data && find . -type f | sort`)
		atSnapshot := shaLines(section(wrote, "sums"))
		Expect(atSnapshot).To(HaveLen(3), wrote)
		filesAtSnapshot := section(wrote, "files")

		vs := newUnstructured(volumeSnapshotGVK, ns, snapName)
		vs.Object["spec"] = map[string]any{
			"volumeSnapshotClassName": snapClass,
			"source":                  map[string]any{"persistentVolumeClaimName": resizePVC},
		}
		Expect(k8s.Create(ctx, vs)).To(Succeed())
		Eventually(func(g Gomega) bool {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(vs), vs)).To(Succeed())
			msg, _, _ := unstructured.NestedString(vs.Object, "status", "error", "message")
			g.Expect(msg).To(BeEmpty(), "snapshot error")
			ready, _, _ := unstructured.NestedBool(vs.Object, "status", "readyToUse")
			return ready
		}).Should(BeTrue(), "VolumeSnapshot %s ready to use", snapName)
		restoreSize, _, _ := unstructured.NestedString(vs.Object, "status", "restoreSize")
		contentName, _, _ := unstructured.NestedString(vs.Object, "status", "boundVolumeSnapshotContentName")
		content := newUnstructured(snapshotContentsGVK, "", contentName)
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(content), content)).To(Succeed())
		handle, _, _ := unstructured.NestedString(content.Object, "status", "snapshotHandle")
		GinkgoWriter.Printf("snapshot %s: content %s, handle %s, restoreSize %s\n", snapName, contentName, handle, restoreSize)
		Expect(handle).To(MatchRegexp(`^[^/]+/[^/]+/\d+$`), "the driver's POOL/CONTAINER/EPOCH")

		// After the snapshot: an overwrite inside a file, an append, a file replaced, a new file.
		after := runPod("snap-overwriter", resizePVC, nil, `cd /data/snap
dd if=/dev/urandom of=a.bin bs=1M count=4 seek=6 conv=notrunc status=none
dd if=/dev/urandom bs=64k count=10 status=none >> b.bin
echo "after the snapshot" > dir/note
dd if=/dev/urandom of=c.bin bs=1M count=2 status=none
echo "== sums"; sha256sum a.bin b.bin dir/note c.bin`)
		afterSums := shaLines(section(after, "sums"))
		for _, f := range []string{"a.bin", "b.bin", "dir/note"} {
			Expect(afterSums[f]).NotTo(BeEmpty(), after)
			Expect(afterSums[f]).NotTo(Equal(atSnapshot[f]), "%s did not change after the snapshot", f)
		}

		restored := newPVC(restoredPVC, sizeAfter, &corev1.TypedLocalObjectReference{
			APIGroup: ptr.To(snapshotGV.Group), Kind: "VolumeSnapshot", Name: snapName})
		Expect(k8s.Create(ctx, restored)).To(Succeed())
		waitBound(ctx, restored)
		read := runPod("snap-reader", restoredPVC, nil, `cd /data
echo "== check"; (cd snap && sha256sum -c ../at-snapshot.sha256)
echo "== sums"; (cd snap && sha256sum a.bin b.bin dir/note)
echo "== files"; find . -type f | sort
echo "== writable"; echo restored > snap/written-after-restore && cat snap/written-after-restore
echo "== df"; df -k /data`)
		Expect(section(read, "check")).To(Equal("a.bin: OK\nb.bin: OK\ndir/note: OK\n"), read)
		Expect(shaLines(section(read, "sums"))).To(Equal(atSnapshot), read)
		Expect(section(read, "files")).To(Equal(filesAtSnapshot), "the restored volume has the files of the snapshot, not the later c.bin:\n%s", read)
		Expect(section(read, "writable")).To(Equal("restored\n"))
		restoredSize := resource.MustParse(sizeAfter)
		Expect(section(read, "df")).To(MatchRegexp(`\s%d\s`, restoredSize.Value()>>10))

		// The source still has what was written after the snapshot: the restore copied, it did
		// not roll the source back.
		again := runPod("snap-source-reader", resizePVC, nil, `cd /data/snap && sha256sum a.bin b.bin dir/note c.bin`)
		Expect(shaLines(again)).To(Equal(afterSums), again)
	})
}
