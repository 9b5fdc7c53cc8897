package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

func newPool(name, serverSet, size string) *storagev1.Pool {
	return &storagev1.Pool{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: storagev1.PoolSpec{
			ServerSetRef: storagev1.LocalObjectReference{Name: serverSet},
			Size:         storagev1.Size(size),
		},
	}
}

func newContainer(name, pool string) *storagev1.Container {
	return &storagev1.Container{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: storagev1.ContainerSpec{
			PoolRef:     storagev1.LocalObjectReference{Name: pool},
			ObjectClass: "SX",
		},
	}
}

func getPool(name string) *storagev1.Pool {
	p := &storagev1.Pool{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, p)).To(Succeed())
	return p
}

func getContainer(name string) *storagev1.Container {
	c := &storagev1.Container{}
	Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, c)).To(Succeed())
	return c
}

func gone(obj client.Object) func() bool {
	return func() bool {
		return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj))
	}
}

var _ = Describe("Pool and Container on a real engine", Ordered, func() {
	var (
		ms     mgmtpb.MgmtClient
		msAddr string
	)

	BeforeAll(func() {
		e := startEngine("tank", false)
		msAddr = e.addr
		ms = msClient(e.addr)
		Expect(k8s.Create(ctx, newServerSet("tank", e.addr, 1))).To(Succeed())
		Eventually(func() int32 { return getServerSet("tank")().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(1)))
	})

	waitPoolReady := func(name string) *storagev1.Pool {
		Eventually(func() storagev1.PoolState { return getPool(name).Status.State }, 60*time.Second).Should(Equal(storagev1.PoolStateReady),
			func() string { return condition(getPool(name).Status.Conditions, storagev1.ConditionReady).Message })
		return getPool(name)
	}
	waitContainerReady := func(name string) *storagev1.Container {
		Eventually(func() storagev1.ContainerState { return getContainer(name).Status.State }, 60*time.Second).Should(Equal(storagev1.ContainerStateReady),
			func() string {
				return condition(getContainer(name).Status.Conditions, storagev1.ConditionReady).Message
			})
		return getContainer(name)
	}

	It("creates a pool whose status is the management service's PoolQuery", func() {
		Expect(k8s.Create(ctx, newPool("alpha", "tank", "64MiB"))).To(Succeed())
		p := waitPoolReady("alpha")
		Expect(p.Finalizers).To(ContainElement(storagev1.Finalizer))
		info, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: "alpha"})
		Expect(err).NotTo(HaveOccurred())
		Expect(p.Status.UUID).To(Equal(info.Uuid))
		Expect(p.Status.Label).To(Equal("alpha"))
		Expect(p.Status.MapVersion).To(Equal(int64(info.MapVersion)))
		Expect(p.Status.TotalTargets).To(Equal(int32(info.TotalTargets)))
		var total, free uint64
		Expect(p.Status.Tiers).To(HaveLen(len(info.Tiers)))
		for i, t := range info.Tiers {
			Expect(p.Status.Tiers[i]).To(Equal(storagev1.TierStatus{Name: t.Name, Total: int64(t.Total), Free: int64(t.Free)}))
			total += t.Total
			free += t.Free
		}
		Expect(total).To(BeNumerically("~", 64<<20, 1<<20))
		Expect(p.Status.Size).To(Equal(humanBytes(total)))
		Expect(p.Status.Free).To(Equal(humanBytes(free)))
		Expect(condition(p.Status.Conditions, storagev1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
		Expect(p.Status.DisabledTargets).To(Equal(int32(info.DisabledTargets)))
		Expect(p.Status.ReintegratingTargets).To(Equal(int32(info.ReintegratingTargets)))
		Expect(p.Status.RanksOut).To(BeEmpty())
		Expect(condition(p.Status.Conditions, storagev1.ConditionDegraded)).To(And(
			HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "AllTargetsUp")))
		Expect(p.Status.ObservedGeneration).To(Equal(p.Generation))
	})

	It("adopts an existing pool with the same label instead of creating another", func() {
		made, err := ms.PoolCreate(ctx, &mgmtpb.PoolCreateReq{Label: "legacy", TotalSize: 64 << 20})
		Expect(err).NotTo(HaveOccurred())
		p := newPool("adopter", "tank", "64MiB")
		p.Spec.Label = "legacy"
		Expect(k8s.Create(ctx, p)).To(Succeed())
		Expect(waitPoolReady("adopter").Status.UUID).To(Equal(made.Uuid))
		list, err := ms.PoolList(ctx, &mgmtpb.PoolListReq{})
		Expect(err).NotTo(HaveOccurred())
		n := 0
		for _, x := range list.Pools {
			if x.Label == "legacy" {
				n++
			}
		}
		Expect(n).To(Equal(1))
	})

	It("creates and adopts containers, and holds the pool's deletion while they exist", func() {
		data := newContainer("data", "alpha")
		data.Spec.Sync = "always"
		Expect(k8s.Create(ctx, data)).To(Succeed())
		c := waitContainerReady("data")
		info, err := ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: "alpha", Id: "data"})
		Expect(err).NotTo(HaveOccurred())
		Expect(info.Props).To(HaveKeyWithValue("sync", "always"), "spec.sync reaches the store")
		Expect(c.Status.UUID).To(Equal(info.Uuid))
		Expect(c.Status.PoolUUID).To(Equal(getPool("alpha").Status.UUID))
		Expect(c.Status.ObjectClass).To(Equal("SX"))
		Expect(c.Status.UsedBytes).To(Equal(int64(info.UsedBytes)))

		By("adopting a container made outside Kubernetes")
		made, err := ms.ContCreate(ctx, &mgmtpb.ContCreateReq{Pool: "alpha", Label: "scratch", Oclass: "S1"})
		Expect(err).NotTo(HaveOccurred())
		adopt := newContainer("scratch", "alpha")
		adopt.Spec.ObjectClass = "S1"
		Expect(k8s.Create(ctx, adopt)).To(Succeed())
		Expect(waitContainerReady("scratch").Status.UUID).To(Equal(made.Uuid))

		By("holding the pool while containers reference it")
		pool := getPool("alpha")
		Expect(k8s.Delete(ctx, pool)).To(Succeed())
		Eventually(func() metav1.Condition {
			return condition(getPool("alpha").Status.Conditions, storagev1.ConditionDeletionBlocked)
		}).Should(And(HaveField("Reason", "ContainersExist"), HaveField("Message", ContainSubstring("data, scratch"))))
		Consistently(func() error {
			_, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: pool.Status.UUID})
			return err
		}, 2*time.Second).Should(Succeed())

		By("deleting the containers (reclaim policy Delete) releases the pool")
		Expect(k8s.Delete(ctx, getContainer("data"))).To(Succeed())
		Expect(k8s.Delete(ctx, getContainer("scratch"))).To(Succeed())
		Eventually(gone(pool), 60*time.Second).Should(BeTrue())
		_, err = ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: pool.Status.UUID, Id: info.Uuid})
		Expect(grpcCode(err)).To(Equal(codes.NotFound))
		_, err = ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: pool.Status.UUID})
		Expect(grpcCode(err)).To(Equal(codes.NotFound), "reclaim policy Delete destroys the pool in the store")
	})

	It("retains a pool and a container whose reclaim policy is Retain", func() {
		p := newPool("kept", "tank", "64MiB")
		p.Spec.ReclaimPolicy = storagev1.ReclaimRetain
		Expect(k8s.Create(ctx, p)).To(Succeed())
		uuid := waitPoolReady("kept").Status.UUID
		c := newContainer("kept-data", "kept")
		c.Spec.ReclaimPolicy = storagev1.ReclaimRetain
		Expect(k8s.Create(ctx, c)).To(Succeed())
		cuuid := waitContainerReady("kept-data").Status.UUID

		Expect(k8s.Delete(ctx, getContainer("kept-data"))).To(Succeed())
		Expect(k8s.Delete(ctx, getPool("kept"))).To(Succeed())
		Eventually(gone(p), 60*time.Second).Should(BeTrue())
		_, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: uuid})
		Expect(err).NotTo(HaveOccurred(), "reclaim policy Retain keeps the pool in the store")
		_, err = ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: uuid, Id: cuuid})
		Expect(err).NotTo(HaveOccurred(), "reclaim policy Retain keeps the container in the store")
	})

	It("reports a management service refusal in the condition and retries", func() {
		c := newContainer("too-safe", "adopter")
		c.Spec.ObjectClass = "S1"
		c.Spec.RedundancyFactor = ptrInt32(1)
		Expect(k8s.Create(ctx, c)).To(Succeed())
		Eventually(func() metav1.Condition {
			return condition(getContainer("too-safe").Status.Conditions, storagev1.ConditionReady)
		}, 30*time.Second).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ManagementServiceError"),
			HaveField("Message", ContainSubstring("too-safe"))))
		GinkgoWriter.Println("refusal:", condition(getContainer("too-safe").Status.Conditions, storagev1.ConditionReady).Message)
	})

	It("clears the figures of a pool and a container the management service no longer has", func() {
		// Small: the pools retained by the specs above hold most of the engine's device; SCM still
		// needs 1 MiB per target.
		small := newPool("vanish", "tank", "32MiB")
		small.Spec.TierRatio = "0.1"
		Expect(k8s.Create(ctx, small)).To(Succeed())
		waitPoolReady("vanish")
		Expect(k8s.Create(ctx, newContainer("vanish-data", "vanish"))).To(Succeed())
		waitContainerReady("vanish-data")
		putObject(msAddr, "vanish", "vanish-data", "SX:1.1", make([]byte, 1<<20))
		Eventually(func() int64 { return getContainer("vanish-data").Status.UsedBytes }, 30*time.Second).Should(BeNumerically(">", 0))
		p, c := getPool("vanish"), getContainer("vanish-data")
		Expect(p.Status.Tiers).NotTo(BeEmpty())
		Expect(p.Status.Size).NotTo(BeEmpty())
		Expect(p.Status.TotalTargets).To(BeNumerically(">", 0))
		Expect(c.Status.Used).NotTo(BeEmpty())
		puuid, cuuid := p.Status.UUID, c.Status.UUID

		By("destroying both in the store, behind the operator's back")
		_, err := ms.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: puuid, Id: cuuid})
		Expect(err).NotTo(HaveOccurred())
		_, err = ms.PoolDestroy(ctx, &mgmtpb.PoolDestroyReq{Id: puuid})
		Expect(err).NotTo(HaveOccurred())

		By("the status keeps only what names the lost objects, and the conditions say why")
		Eventually(func(g Gomega) {
			p := &storagev1.Pool{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vanish"}, p)).To(Succeed())
			g.Expect(p.Status.State).To(Equal(storagev1.PoolStateLost))
			g.Expect(p.Status).To(And(
				HaveField("UUID", puuid), HaveField("Label", "vanish"),
				HaveField("Tiers", BeEmpty()), HaveField("Size", ""), HaveField("Free", ""),
				HaveField("MapVersion", BeZero()), HaveField("Ranks", BeEmpty()), HaveField("TotalTargets", BeZero()),
				HaveField("DisabledTargets", BeZero()), HaveField("Containers", BeZero()),
				HaveField("ReintegratingTargets", BeZero()), HaveField("RanksOut", BeEmpty()),
			))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionReady)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "NotFoundInManagementService"),
				HaveField("Message", And(ContainSubstring("management service"), ContainSubstring(puuid)))))
			g.Expect(condition(p.Status.Conditions, storagev1.ConditionDegraded)).To(And(
				HaveField("Status", metav1.ConditionUnknown), HaveField("Reason", "NotFoundInManagementService")))
		}, 30*time.Second).Should(Succeed())
		Eventually(func(g Gomega) {
			c := &storagev1.Container{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "vanish-data"}, c)).To(Succeed())
			g.Expect(c.Status.State).To(Equal(storagev1.ContainerStateLost))
			g.Expect(c.Status).To(And(
				HaveField("UUID", cuuid), HaveField("PoolUUID", puuid),
				HaveField("UsedBytes", BeZero()), HaveField("Used", ""), HaveField("Snapshots", BeZero()),
				HaveField("ObjectClass", ""), HaveField("RedundancyFactor", BeZero()),
			))
			g.Expect(condition(c.Status.Conditions, storagev1.ConditionReady)).To(And(
				HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "NotFoundInManagementService"),
				HaveField("Message", And(ContainSubstring("management service"), ContainSubstring(cuuid)))))
		}, 30*time.Second).Should(Succeed())
		GinkgoWriter.Println("lost pool:", condition(getPool("vanish").Status.Conditions, storagev1.ConditionReady).Message)
		GinkgoWriter.Println("lost container:", condition(getContainer("vanish-data").Status.Conditions, storagev1.ConditionReady).Message)

		By("cleaning up the objects")
		c, p = getContainer("vanish-data"), getPool("vanish")
		Expect(k8s.Delete(ctx, c)).To(Succeed())
		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Eventually(gone(p), 60*time.Second).Should(BeTrue())
	})

	It("sets the ACL, owner, group and allowed namespaces of a pool and a container, at creation and when the spec changes", func() {
		props := func(get func() (map[string]string, error)) func(Gomega) map[string]string {
			return func(g Gomega) map[string]string {
				p, err := get()
				g.Expect(err).NotTo(HaveOccurred())
				return p
			}
		}
		poolProps := props(func() (map[string]string, error) {
			info, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: "guarded"})
			return info.GetProps(), err
		})
		contProps := props(func() (map[string]string, error) {
			info, err := ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: "guarded", Id: "guarded-data"})
			return info.GetProps(), err
		})
		// The store keeps names without their @ and the ACL re-written: compared as the
		// reconcilers compare them.
		sameAs := func(k, want string) types.GomegaMatcher {
			return WithTransform(func(p map[string]string) bool { return sameProp(k, want, p[k]) }, BeTrue())
		}

		p := newPool("guarded", "tank", "32MiB")
		p.Spec.TierRatio = "0.1"
		p.Spec.ACL = "A::OWNER@:rwa,A:G:GROUP@:rw,A::EVERYONE@:r"
		p.Spec.Owner, p.Spec.Group = "alice@", "staff@"
		p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-a", "team-b/trainer"}
		Expect(k8s.Create(ctx, p)).To(Succeed())
		waitPoolReady("guarded")
		Expect(poolProps(Default)).To(And(
			sameAs(storagev1.PropACL, "A::OWNER@:rwa,A:G:GROUP@:rw,A::EVERYONE@:r"),
			sameAs(storagev1.PropOwner, "alice@"), sameAs(storagev1.PropGroup, "staff@"),
			HaveKeyWithValue(storagev1.PropAllowedNamespaces, "team-a,team-b/trainer")))

		By("a change of the spec reaches the store")
		Expect(updateFresh(p, func() {
			p.Spec.Owner = "bob@"
			p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-c"}
			p.Spec.ACL = "A::OWNER@:rwa,A:G:GROUP@:r"
		})).To(Succeed())
		Eventually(poolProps, 30*time.Second).Should(And(
			sameAs(storagev1.PropOwner, "bob@"), sameAs(storagev1.PropGroup, "staff@"),
			sameAs(storagev1.PropACL, "A::OWNER@:rwa,A:G:GROUP@:r"),
			HaveKeyWithValue(storagev1.PropAllowedNamespaces, "team-c")))

		By("emptying the list lifts the restriction")
		Expect(updateFresh(p, func() { p.Spec.AllowedNamespaces = nil })).To(Succeed())
		Eventually(poolProps, 30*time.Second).Should(HaveKeyWithValue(storagev1.PropAllowedNamespaces, storagev1.AnyNamespace))

		By("a container's fields, at creation and on change")
		c := newContainer("guarded-data", "guarded")
		c.Spec.Owner = "carol@"
		c.Spec.ACL = "A::OWNER@:rwa,A::dave@:r"
		c.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-a/trainer"}
		Expect(k8s.Create(ctx, c)).To(Succeed())
		waitContainerReady("guarded-data")
		Expect(contProps(Default)).To(And(
			sameAs(storagev1.PropOwner, "carol@"), sameAs(storagev1.PropACL, "A::OWNER@:rwa,A::dave@:r"),
			HaveKeyWithValue(storagev1.PropAllowedNamespaces, "team-a/trainer")))
		Expect(updateFresh(c, func() {
			c.Spec.Group = "staff@"
			c.Spec.ACL = "A::OWNER@:rwa,A::dave@:rw"
			c.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-a", "team-b"}
		})).To(Succeed())
		Eventually(contProps, 30*time.Second).Should(And(
			sameAs(storagev1.PropGroup, "staff@"), sameAs(storagev1.PropACL, "A::OWNER@:rwa,A::dave@:rw"),
			HaveKeyWithValue(storagev1.PropAllowedNamespaces, "team-a,team-b")))
		Expect(updateFresh(c, func() { c.Spec.AllowedNamespaces = nil })).To(Succeed())
		Eventually(contProps, 30*time.Second).Should(HaveKeyWithValue(storagev1.PropAllowedNamespaces, storagev1.AnyNamespace))

		By("cleaning up the objects")
		Expect(k8s.Delete(ctx, getContainer("guarded-data"))).To(Succeed())
		Expect(k8s.Delete(ctx, getPool("guarded"))).To(Succeed())
		Eventually(gone(p), 60*time.Second).Should(BeTrue())
	})
})

func ptrInt32(v int32) *int32 { return &v }
