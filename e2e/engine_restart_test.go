package e2e

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	storagek8s "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// Suite 4: an engine pod deleted under a pod writing to a PVC. What the store promises (README
// "Engines that go away and come back"): an engine stopped by SIGTERM tells the management
// service, which excludes its targets at once, and updates go on degraded; the StatefulSet brings
// the pod back under the same name, so the same rank, on the same device; its targets take
// updates at once and serve reads once reintegrated. So the assertions are: no write fails and
// none waits long, writes go on once it is back, the rank comes back joined with the UUID its
// device's superblock carries, and everything written before, during and after the outage reads
// back with its checksum once reintegration is done, as does the shared PVC's 1 GiB.
//
// The writer's PVC is of a class of its own, which survives an engine failure: rf 1 and
// replicated directories. The shared PVC's class keeps the driver's defaults (rf 0, directories
// S1, not redundant): creating a file in a directory whose one shard is on the engine away fails
// with EIO (seen here), which is what rf 0 allows.
const (
	outageClass = "peregrine-e2e-rf1"
	outagePVC   = "outage"
)

// engineLog reads the log of an engine pod.
func engineLog(ctx context.Context, name string) string {
	r, err := cs.CoreV1().Pods(storeNS).GetLogs(name, &corev1.PodLogOptions{Container: "engine"}).Stream(ctx)
	if err != nil {
		return "(no logs: " + err.Error() + ")"
	}
	defer r.Close()
	b, _ := io.ReadAll(r)
	return string(b)
}

func engineStatus(ss *storagev1.ServerSet, rank int32) *storagev1.EngineStatus {
	for i := range ss.Status.Engines {
		if ss.Status.Engines[i].Rank == rank {
			return &ss.Status.Engines[i]
		}
	}
	return nil
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// deviceOf is where the engine pod's device comes from on the node: the emulated devices'
// host directory (the file in it is named by rank) or the NVMe device's path.
func deviceOf(p *corev1.Pod) string {
	for _, v := range p.Spec.Volumes {
		if (v.Name == "devices" || v.Name == "nvme") && v.HostPath != nil {
			return v.Name + ":" + v.HostPath.Path
		}
	}
	return ""
}

var (
	writeLine = regexp.MustCompile(`(?m)^write (\d+) ms=(\d+) at=(\d+)$`)
	ansi      = regexp.MustCompile("\x1b\\[[0-9;]*m")
	// The engine names the device it opened: "storage open device=PATH targets=N ...".
	storageOpen = regexp.MustCompile(`storage open device=(\S+)`)
)

// openedDevice is the device an engine's log says it opened ("" before it did).
func openedDevice(log string) string {
	m := storageOpen.FindStringSubmatch(ansi.ReplaceAllString(log, ""))
	if m == nil {
		return ""
	}
	return m[1]
}

// writerProgress returns how many writes the outage writer has made, the slowest one, and
// when that one ended.
func writerProgress(logs string) (n int, slowest time.Duration, slowEnd time.Time) {
	for _, m := range writeLine.FindAllStringSubmatch(logs, -1) {
		i, _ := strconv.Atoi(m[1])
		ms, _ := strconv.Atoi(m[2])
		at, _ := strconv.ParseInt(m[3], 10, 64)
		n = max(n, i)
		if d := time.Duration(ms) * time.Millisecond; d > slowest {
			slowest, slowEnd = d, time.UnixMilli(at)
		}
	}
	return n, slowest, slowEnd
}

func engineRestartSpecs(ctx context.Context) {
	It("deletes an engine pod under a writer: no write fails, the rank comes back on its device, every byte reads back", func() {
		ss := &storagev1.ServerSet{}
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: storeNS, Name: storeName}, ss)).To(Succeed())
		// The last rank: rank 0 (and the next MgmtSvcReplicas-1) host the management service,
		// whose outage is another story (nobody can exclude anything while it is away).
		rank := ss.Spec.Engines - 1
		Expect(rank).To(BeNumerically(">=", max(ss.Spec.MgmtSvcReplicas, 1)), "no rank outside the management service to stop")
		podName := fmt.Sprintf("%s-%d", storeName, rank)
		before := engineStatus(ss, rank)
		Expect(before).NotTo(BeNil(), "rank %d in %v", rank, ss.Status.Engines)
		Expect(before.State).To(Equal(storagev1.EngineJoined))
		Expect(before.Formatted).To(BeTrue())
		Expect(before.UUID).NotTo(BeEmpty())
		var old corev1.Pod
		Expect(k8s.Get(ctx, types.NamespacedName{Namespace: storeNS, Name: podName}, &old)).To(Succeed())
		Expect(podReady(&old)).To(BeTrue())
		device := deviceOf(&old)
		Expect(device).NotTo(BeEmpty(), "the device volume of %s", podName)
		opened := openedDevice(engineLog(ctx, podName))
		Expect(opened).NotTo(BeEmpty(), "%s's log names no device it opened", podName)

		sc := &storagek8s.StorageClass{
			ObjectMeta:           metav1.ObjectMeta{Name: outageClass},
			Provisioner:          "csi.peregrine.dev",
			Parameters:           map[string]string{"pool": poolLabel, "oclass": "EC_2P1G1", "dirOclass": "RP_2G1", "rf": "1"},
			AllowVolumeExpansion: ptr.To(true),
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sc))).To(Succeed())
		deletePodAndWait("outage-writer")
		deletePodAndWait("outage-reader")
		pvc := newPVC(outagePVC, "512Mi", nil)
		pvc.Spec.StorageClassName = ptr.To(outageClass)
		deleteAndWait(ctx, pvc.DeepCopy())
		Expect(k8s.Create(ctx, pvc)).To(Succeed())
		DeferCleanup(deleteAndWait, ctx, pvc.DeepCopy())
		waitBound(ctx, pvc)

		// Writes every 200 ms of 256 KiB each, with their checksums; the pod fails at the first
		// failed write.
		startPod("outage-writer", outagePVC, `trap 'exit 0' TERM
mkdir -p /data/outage && cd /data/outage
i=0
while :; do
  i=$((i+1)); t0=$(date +%s%N)
  dd if=/dev/urandom of=chunk.$i bs=64k count=4 status=none
  sha256sum chunk.$i >> sums
  t1=$(date +%s%N)
  echo "write $i ms=$(((t1 - t0) / 1000000)) at=$((t1 / 1000000))"
  sleep 0.2
done`)
		progress := func() int {
			n, _, _ := writerProgress(podLogs("outage-writer"))
			return n
		}
		Eventually(func(g Gomega) int {
			expectRunning(g, "outage-writer")
			return progress()
		}).Should(BeNumerically(">=", 10))

		// The pod deleted as a user or the eviction would: SIGTERM and the grace period.
		deleted := time.Now()
		atDelete := progress()
		Expect(k8s.Delete(ctx, &old)).To(Succeed())
		var fresh corev1.Pod
		Eventually(func(g Gomega) {
			expectRunning(g, "outage-writer")
			g.Expect(k8s.Get(ctx, types.NamespacedName{Namespace: storeNS, Name: podName}, &fresh)).To(Succeed())
			g.Expect(fresh.UID).NotTo(Equal(old.UID))
			g.Expect(podReady(&fresh)).To(BeTrue())
		}).WithPolling(250 * time.Millisecond).Should(Succeed())
		back := time.Now()
		GinkgoWriter.Printf("%s deleted: back and ready after %s; %d writes meanwhile\n",
			podName, back.Sub(deleted).Round(100*time.Millisecond), progress()-atDelete)

		// Same rank (the pod's ordinal, which the engine says it is), same device (the same
		// host volume and path in the pod, and the UUID of the superblock on it: an engine on
		// another device would be in maintenance with a UUID of its own), joined, and
		// reintegrated.
		Expect(deviceOf(&fresh)).To(Equal(device))
		Eventually(func() string { return engineLog(ctx, podName) }).
			Should(MatchRegexp(`peregrine-engine: rank %d ready`, rank))
		Expect(openedDevice(engineLog(ctx, podName))).To(Equal(opened), "the device the engine opened")
		Expect(engineLog(ctx, podName)).NotTo(ContainSubstring("maintenance mode"))
		Eventually(func(g Gomega) {
			expectRunning(g, "outage-writer")
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(ss), ss)).To(Succeed())
			e := engineStatus(ss, rank)
			g.Expect(e).NotTo(BeNil())
			g.Expect(e.State).To(Equal(storagev1.EngineJoined))
			g.Expect(e.UUID).To(Equal(before.UUID), "the engine UUID of rank %d", rank)
			g.Expect(e.Formatted).To(BeTrue())
			g.Expect(e.StorageState).To(Equal(storagev1.StorageReady))
			g.Expect(e.TargetsOut).To(BeZero(), "rank %d still has targets out", rank)
			g.Expect(ss.Status.ReadyEngines).To(Equal(ss.Spec.Engines))
			g.Expect(ss.Status.EnginesWithTargetsOut).To(BeZero())
			g.Expect(ready(ss.Status.Conditions)).To(BeTrue(), "%v", ss.Status.Conditions)
		}).Should(Succeed())
		reintegrated := time.Now()
		GinkgoWriter.Printf("rank %d joined and reintegrated %s after it was back\n", rank, reintegrated.Sub(back).Round(100*time.Millisecond))

		// Writes go on once the engine is back and in.
		atBack := progress()
		Eventually(func(g Gomega) int {
			expectRunning(g, "outage-writer")
			return progress()
		}).Should(BeNumerically(">=", atBack+10))
		// Its log goes with the pod: read it first. A write made between the two is not counted.
		total, slowest, slowEnd := writerProgress(podLogs("outage-writer"))
		deletePodAndWait("outage-writer")
		GinkgoWriter.Printf("outage writer: %d writes, the slowest %s, ending %s after the deletion\n",
			total, slowest, slowEnd.Sub(deleted).Round(100*time.Millisecond))
		// An update in flight to the deleted engine waits out the client's connect timeout
		// (5 s: the pod's address is gone, nothing refuses the connection) before it goes on
		// without it; the pod is back within seconds, so few writes or none complete while it
		// is out. The bound leaves room for a loaded 2-core node.
		Expect(slowest).To(BeNumerically("<", 20*time.Second), "a write waited %s", slowest)

		// Everything reads back: each chunk written before, during and after the outage (from
		// the targets of the rank that was away too, now that it serves reads again), and the
		// 1 GiB the shared PVC got before.
		logs := runPod("outage-reader", outagePVC, nil, `cd /data/outage
sha256sum -c --quiet sums && echo "chunks: $(wc -l < sums) OK"
echo "after the outage" > /data/outage/new && cat /data/outage/new`)
		m := regexp.MustCompile(`chunks: (\d+) OK`).FindStringSubmatch(logs)
		Expect(m).NotTo(BeNil(), logs)
		chunks, _ := strconv.Atoi(m[1])
		// The writer may have been stopped between a chunk and its checksum: that chunk is not
		// counted, every other is.
		Expect(chunks).To(BeNumerically(">=", total), logs)
		Expect(strings.TrimSpace(logs)).To(HaveSuffix("after the outage"))
		Expect(runPod("outage-shared-reader", "shared", nil, `cd /data/run && sha256sum -c blob.sha256`)).
			To(ContainSubstring("blob: OK"))
	})
}
