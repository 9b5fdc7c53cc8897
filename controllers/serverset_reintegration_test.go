package controllers

import (
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

var _ = Describe("ServerSet rolling upgrade across a reintegration", func() {
	It("restarts the next engine only once the restarted one is up and in every pool again, and reports its targets meanwhile", func() {
		const name, poolName = "heal", "heal-pool"
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
		partition := func() int32 {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return currentPartition(sts)
		}

		By("ranks 0 and 1 start and are formatted")
		startEnginePod(sts, cm, 0, msAddr)
		rank1 := startEnginePod(sts, cm, 1, msAddr)
		markPodsReady(key, 2)
		Eventually(func() []storagev1.EngineStatus { return getServerSet(name)().Status.Engines }, 60*time.Second).
			Should(ConsistOf(joinedRank(0), joinedRank(1)))

		By("a pool over both engines, every target up and in")
		Expect(k8s.Create(ctx, newPool(poolName, name, "128MiB"))).To(Succeed())
		Eventually(func(g Gomega) {
			p := getPool(poolName)
			g.Expect(p.Status.State).To(Equal(storagev1.PoolStateReady))
			g.Expect(p.Status.Ranks).To(ConsistOf(int32(0), int32(1)))
			g.Expect(p.Status).To(And(HaveField("DisabledTargets", BeZero()), HaveField("ReintegratingTargets", BeZero()),
				HaveField("RanksOut", BeEmpty())))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionDegraded).Reason).To(Equal("AllTargetsUp"))
		}, 60*time.Second).Should(Succeed())

		By("a new image: the roll starts with rank 1")
		updateServerSet(name, func(ss *storagev1.ServerSet) { ss.Spec.Image = "peregrine:v2" })
		Eventually(partition, 20*time.Second).Should(Equal(int32(1)))

		By("rank 1's pod restarts: while its engine is away its targets are down in the pool, and both statuses say so")
		rank1.stop()
		Eventually(func(g Gomega) {
			got := getServerSet(name)()
			g.Expect(got.Status.Engines).To(ContainElement(And(HaveField("Rank", int32(1)), HaveField("State", storagev1.EngineStopped),
				HaveField("TargetsOut", BeNumerically(">", 0)))))
			g.Expect(got.Status.EnginesWithTargetsOut).To(Equal(int32(1)))
			g.Expect(condition(got.Status.Conditions, storagev1.ConditionDegraded)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "EnginesDown"),
				HaveField("Message", ContainSubstring("target(s) not up-and-in"))))
			p := getPool(poolName)
			g.Expect(p.Status.DisabledTargets).To(BeNumerically(">", 0))
			g.Expect(p.Status.RanksOut).To(ConsistOf(storagev1.RankTargetState{Rank: 1, State: storagev1.TargetDown}))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionDegraded)).To(And(
				HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "TargetsDown"),
				HaveField("Message", ContainSubstring("rank 1 down"))))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionReady).Status).To(Equal(metav1.ConditionTrue),
				"a degraded pool still serves")
		}, 60*time.Second).Should(Succeed())

		By("Kubernetes reports the updated pod ready, but the system is not whole: the roll holds and says why")
		updateStatefulSetStatus(key, func(sts *appsv1.StatefulSet) {
			sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.UpdatedReplicas = 2, 2, 1
			sts.Status.ObservedGeneration = sts.Generation
		})
		Eventually(func() metav1.Condition {
			return condition(getServerSet(name)().Status.Conditions, storagev1.ConditionProgressing)
		}, 20*time.Second).Should(And(HaveField("Reason", "WaitingForSystem"), HaveField("Message", ContainSubstring("rank 1: stopped"))))
		Consistently(partition, 3*time.Second, 500*time.Millisecond).Should(Equal(int32(1)))

		By("rank 1's engine is back: it rejoins, its targets are reintegrated, and only then does the roll move on")
		ms := msClient(msAddr)
		startEnginePod(sts, cm, 1, msAddr)
		var seen []string // rank 1 as the operator's gate would judge it, each time it changes
		Eventually(func() int32 {
			if sys, err := ms.SystemQuery(ctx, &mgmtpb.SystemQueryReq{}); err == nil {
				_, msg := rollGate(sys.Members, 2)
				if len(seen) == 0 || seen[len(seen)-1] != msg {
					seen = append(seen, msg)
				}
			}
			return partition()
		}, 90*time.Second, 200*time.Millisecond).Should(Equal(int32(0)), func() string {
			return fmt.Sprintf("gate: %q; Progressing: %s", seen, condition(getServerSet(name)().Status.Conditions, storagev1.ConditionProgressing).Message)
		})
		GinkgoWriter.Println("the gate judged, in turn:", seen)
		sys, err := ms.SystemQuery(ctx, &mgmtpb.SystemQueryReq{})
		Expect(err).NotTo(HaveOccurred())
		for _, m := range sys.Members {
			Expect(m).To(And(HaveField("State", mgmtpb.MemberState_MEMBER_STATE_JOINED), HaveField("TargetsOut", BeZero())), "rank %d", m.Rank)
		}

		By("both statuses show every target up and in again")
		Eventually(func(g Gomega) {
			got := getServerSet(name)()
			g.Expect(got.Status.EnginesWithTargetsOut).To(BeZero())
			g.Expect(got.Status.Engines).To(ConsistOf(And(joinedRank(0), HaveField("TargetsOut", BeZero())),
				And(joinedRank(1), HaveField("TargetsOut", BeZero()))))
			g.Expect(condition(got.Status.Conditions, storagev1.ConditionDegraded).Status).To(Equal(metav1.ConditionFalse))
			p := getPool(poolName)
			g.Expect(p.Status.State).To(Equal(storagev1.PoolStateReady))
			g.Expect(p.Status).To(And(HaveField("DisabledTargets", BeZero()), HaveField("ReintegratingTargets", BeZero()),
				HaveField("RanksOut", BeEmpty())))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionDegraded).Reason).To(Equal("AllTargetsUp"))
		}, 30*time.Second).Should(Succeed())
		var events corev1.EventList
		Expect(k8s.List(ctx, &events, client.InNamespace("default"))).To(Succeed())
		for _, e := range events.Items {
			if e.InvolvedObject.Name == poolName && e.Reason == "StateChanged" {
				GinkgoWriter.Println("pool event:", e.Message)
			}
		}
	})
})
