package controllers

import (
	"fmt"
	"io"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// serverSetEvents are the events recorded for the ServerSet name.
func serverSetEvents(name string) []corev1.Event {
	var list corev1.EventList
	Expect(k8s.List(ctx, &list, client.InNamespace("default"))).To(Succeed())
	var out []corev1.Event
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == "ServerSet" && e.InvolvedObject.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// markPodsReady does what the StatefulSet controller and the kubelets would once the engine pods
// of ordinals 0..ready-1 run: it reports them ready and updated in the StatefulSet's status.
func markPodsReady(key client.ObjectKey, ready int32) {
	updateStatefulSetStatus(key, func(sts *appsv1.StatefulSet) {
		sts.Status.ObservedGeneration = sts.Generation
		sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.AvailableReplicas = ready, ready, ready
		sts.Status.CurrentReplicas, sts.Status.UpdatedReplicas = ready, ready
	})
}

// joinedRank matches an EngineStatus of the given rank, joined and formatted.
func joinedRank(rank int32) types.GomegaMatcher {
	return And(HaveField("Rank", rank), HaveField("State", storagev1.EngineJoined), HaveField("Formatted", BeTrue()))
}

var _ = Describe("ServerSet scale-up", func() {
	It("adds engines to the running system: each new rank joins blank, is formatted and reported", func() {
		const name = "grow"
		key := client.ObjectKey{Namespace: "default", Name: name}
		cp, dp := freePort(), freePort()
		msAddr := fmt.Sprintf("%s:%d", podIP(0), cp)
		ss := newServerSet(name, msAddr, 1)
		ss.Spec.ControlPort, ss.Spec.DataPort = int32(cp), int32(dp)
		ss.Spec.MetricsPort = int32(freePort()) // the simulated pods share the host's ports
		ss.Spec.Storage.Emulated.Size = "256MiB"
		// The engine does not read the fabric settings; its pods get them as environment and
		// must still start (startEnginePod passes the container's environment on).
		ss.Spec.Fabric = storagev1.Fabric{Provider: "tcp", Interface: "lo"}
		Expect(k8s.Create(ctx, ss)).To(Succeed())

		sts, cm := &appsv1.StatefulSet{}, &corev1.ConfigMap{}
		Eventually(func() error { return k8s.Get(ctx, key, sts) }, 20*time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-config"}, cm)).To(Succeed())
		Expect(*sts.Spec.Replicas).To(Equal(int32(1)))

		By("rank 0's pod starts, hosts the management service and is formatted")
		startEnginePod(sts, cm, 0, msAddr)
		markPodsReady(key, 1)
		Eventually(func() []storagev1.EngineStatus { return getServerSet(name)().Status.Engines }, 60*time.Second).
			Should(ConsistOf(joinedRank(0)))
		By("rank 0's engine serves its metrics on the pod IP and the metrics port the pod declares")
		resp, err := http.Get(fmt.Sprintf("http://%s:%d/metrics", podIP(0), getServerSet(name)().Spec.MetricsPort))
		Expect(err).NotTo(HaveOccurred())
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.Body.Close()).To(Succeed())
		Expect(string(body)).To(ContainSubstring(`peregrine_engine_ready{rank="0"} 1`))
		ms := msClient(msAddr)
		early, err := ms.PoolCreate(ctx, &mgmtpb.PoolCreateReq{Label: "before-scale", TotalSize: 64 << 20})
		Expect(err).NotTo(HaveOccurred())
		templateHash, cfgHash := sts.Annotations[templateHashKey], sts.Spec.Template.Annotations[configHashKey]
		Expect(templateHash).NotTo(BeEmpty())

		By("scaling from one engine to three")
		updateServerSet(name, func(ss *storagev1.ServerSet) { ss.Spec.Engines = 3 })
		Eventually(func() int32 {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return *sts.Spec.Replicas
		}, 20*time.Second).Should(Equal(int32(3)))
		Expect(currentPartition(sts)).To(BeZero(), "scaling up rolls nothing")
		Expect(sts.Annotations[templateHashKey]).To(Equal(templateHash), "scaling up does not change the engines' pod template")
		Expect(sts.Spec.Template.Annotations[configHashKey]).To(Equal(cfgHash), "nor their configuration")
		Eventually(func() metav1.Condition {
			return condition(getServerSet(name)().Status.Conditions, storagev1.ConditionReady)
		}, 20*time.Second).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Message", ContainSubstring("1 of 3 engines joined"))))

		By("rank 1's pod starts: its blank engine joins and is formatted while rank 2's pod is still missing")
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		startEnginePod(sts, cm, 1, msAddr)
		markPodsReady(key, 2)
		Eventually(func() []storagev1.EngineStatus { return getServerSet(name)().Status.Engines }, 60*time.Second).
			Should(ConsistOf(joinedRank(0), And(joinedRank(1), HaveField("ControlAddr", fmt.Sprintf("%s:%d", podIP(1), cp)))))
		got := getServerSet(name)()
		Expect(got.Status.ReadyEngines).To(Equal(int32(2)))
		Expect(condition(got.Status.Conditions, storagev1.ConditionReady)).To(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Message", ContainSubstring("2 of 3 engines joined"))))
		Eventually(func() []corev1.Event { return serverSetEvents(name) }, 20*time.Second).Should(ContainElement(
			And(HaveField("Reason", "Formatted"), HaveField("Message", "formatted ranks 1"))), "the operator formatted the new rank")

		By("rank 2's pod starts")
		startEnginePod(sts, cm, 2, msAddr)
		markPodsReady(key, 3)
		Eventually(func() int32 { return getServerSet(name)().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(3)))
		Eventually(func() []corev1.Event { return serverSetEvents(name) }, 20*time.Second).Should(ContainElement(
			And(HaveField("Reason", "Formatted"), HaveField("Message", "formatted ranks 2"))))

		By("the status is the management service's view of the three ranks")
		Eventually(func(g Gomega) {
			sys, err := ms.SystemQuery(ctx, &mgmtpb.SystemQueryReq{})
			g.Expect(err).NotTo(HaveOccurred())
			scan, err := ms.StorageScan(ctx, &mgmtpb.StorageScanReq{})
			g.Expect(err).NotTo(HaveOccurred())
			want := []storagev1.EngineStatus{}
			var nvme, scm int64
			for _, m := range sys.Members {
				want = append(want, storagev1.EngineStatus{Rank: int32(m.Rank), UUID: m.Uuid, State: storagev1.EngineState(m.State.Word()),
					ControlAddr: m.ControlAddr, FaultDomain: m.FaultDomain, Formatted: true, StorageState: storagev1.StorageReady,
					TargetsOut: int32(m.TargetsOut)})
				g.Expect(m.TargetsOut).To(BeZero(), "rank %d", m.Rank)
			}
			for _, r := range scan.Ranks {
				g.Expect(r.Formatted).To(BeTrue(), "rank %d", r.Rank)
				g.Expect(r.System).To(Equal(name))
				nvme += int64(r.BdevBytes)
				scm += int64(r.ScmBytes)
			}
			g.Expect(want).To(HaveLen(3))
			g.Expect(want).To(ContainElement(HaveField("FaultDomain", "/node2")))
			g.Expect(getServerSet(name)().Status).To(And(
				HaveField("Engines", ConsistOf(want)),
				HaveField("MapVersion", int64(sys.MapVersion)),
				HaveField("EnginesWithTargetsOut", BeZero()),
				HaveField("Capacity", ConsistOf( // each tier summed over the three ranks
					And(HaveField("Name", "scm"), HaveField("Total", scm)),
					And(HaveField("Name", "nvme"), HaveField("Total", nvme)),
				)),
			))
		}, 20*time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			conds := getServerSet(name)().Status.Conditions
			g.Expect(condition(conds, storagev1.ConditionReady)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Message", "3 of 3 engines joined")))
			g.Expect(condition(conds, storagev1.ConditionDegraded).Status).To(Equal(metav1.ConditionFalse))
			g.Expect(condition(conds, storagev1.ConditionProgressing)).To(HaveField("Reason", "RolledOut"))
			g.Expect(condition(conds, storagev1.ConditionStorageFormatted).Status).To(Equal(metav1.ConditionTrue))
		}, 20*time.Second).Should(Succeed())

		By("the pool made before the scale-up is untouched: formatting the new ranks left rank 0 alone")
		info, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: early.Uuid})
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Ranks).To(Equal([]uint32{0}))
		Expect(info.State).To(Equal(mgmtpb.PoolState_POOL_STATE_READY))
	})

	It("names an unreachable rank, not a foreign signature, when formatting new ranks meets a stopped one", func() {
		const name = "limp"
		key := client.ObjectKey{Namespace: "default", Name: name}
		cp, dp := freePort(), freePort()
		msAddr := fmt.Sprintf("%s:%d", podIP(0), cp)
		ss := newServerSet(name, msAddr, 2)
		ss.Spec.ControlPort, ss.Spec.DataPort = int32(cp), int32(dp)
		ss.Spec.MetricsPort = int32(freePort()) // the simulated pods share the host's ports
		ss.Spec.Storage.Emulated.Size = "256MiB"
		Expect(k8s.Create(ctx, ss)).To(Succeed())
		sts, cm := &appsv1.StatefulSet{}, &corev1.ConfigMap{}
		Eventually(func() error { return k8s.Get(ctx, key, sts) }, 20*time.Second).Should(Succeed())
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name + "-config"}, cm)).To(Succeed())

		By("ranks 0 and 1 start and are formatted")
		startEnginePod(sts, cm, 0, msAddr)
		rank1 := startEnginePod(sts, cm, 1, msAddr)
		markPodsReady(key, 2)
		Eventually(func() []storagev1.EngineStatus { return getServerSet(name)().Status.Engines }, 60*time.Second).
			Should(ConsistOf(joinedRank(0), joinedRank(1)))

		By("rank 1 stops")
		rank1.stop()
		markPodsReady(key, 1)
		Eventually(func() []storagev1.EngineStatus { return getServerSet(name)().Status.Engines }, 30*time.Second).
			Should(ContainElement(And(HaveField("Rank", int32(1)), HaveField("State", storagev1.EngineStopped))))

		By("scaling to three engines: rank 2 joins blank while rank 1 is stopped")
		updateServerSet(name, func(ss *storagev1.ServerSet) { ss.Spec.Engines = 3 })
		Eventually(func() int32 {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return *sts.Spec.Replicas
		}, 20*time.Second).Should(Equal(int32(3)))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(cm), cm)).To(Succeed())
		startEnginePod(sts, cm, 2, msAddr)

		By("the failed format names the unreachable rank and the management service's error, without the force hint")
		var unreachable []corev1.Event
		Eventually(func() []corev1.Event { return serverSetEvents(name) }, 30*time.Second).Should(ContainElement(
			And(HaveField("Reason", "RankUnreachable"), HaveField("Message", And(
				ContainSubstring("rank 1"), ContainSubstring("engine is stopped"), Not(ContainSubstring(storagev1.AnnotationForceFormat))))),
			&unreachable))
		GinkgoWriter.Println("format failure:", unreachable[0].Message)
		Expect(serverSetEvents(name)).NotTo(ContainElement(HaveField("Reason", "FormatRefused")),
			"no device of this system carries a foreign signature")

		By("the management service formatted rank 2 all the same; rank 1 shows as down")
		Eventually(func(g Gomega) {
			got := getServerSet(name)()
			g.Expect(got.Status.Engines).To(ContainElement(joinedRank(2)))
			g.Expect(condition(got.Status.Conditions, storagev1.ConditionStorageFormatted).Status).To(Equal(metav1.ConditionTrue))
			g.Expect(condition(got.Status.Conditions, storagev1.ConditionDegraded)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Message", ContainSubstring("rank 1 stopped"))))
		}, 30*time.Second).Should(Succeed())
	})
})
