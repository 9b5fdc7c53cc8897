package controllers

import (
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

func newServerSet(name, mgmtAddr string, engines int32) *storagev1.ServerSet {
	ss := &storagev1.ServerSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: storagev1.ServerSetSpec{
			Image:   "peregrine:dev",
			Engines: engines,
			Targets: 2,
			Storage: storagev1.EngineStorage{
				Scm:      "256MiB",
				Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine", Size: "1GiB"},
			},
		},
	}
	if mgmtAddr != "" {
		ss.Annotations = map[string]string{storagev1.AnnotationMgmtAddress: mgmtAddr}
	}
	// Engines without TLS (built before it) can only run insecure.
	ss.Spec.InsecureControlPlane = !engineTLS
	return ss
}

// parseEngineConfig reads a rendered engine configuration back, refusing keys the struct lacks.
func parseEngineConfig(text string) engineConfig {
	var c engineConfig
	dec := yaml.NewDecoder(strings.NewReader(text))
	dec.KnownFields(true)
	Expect(dec.Decode(&c)).To(Succeed(), text)
	return c
}

func getServerSet(name string) func() *storagev1.ServerSet {
	return func() *storagev1.ServerSet {
		ss := &storagev1.ServerSet{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, ss)).To(Succeed())
		return ss
	}
}

// updateServerSet applies change to the latest ServerSet, again when the update races the
// controller's status writes (a conflict).
func updateServerSet(name string, change func(*storagev1.ServerSet)) {
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ss := &storagev1.ServerSet{}
		if err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, ss); err != nil {
			return err
		}
		change(ss)
		return k8s.Update(ctx, ss)
	})).To(Succeed())
}

// updateStatefulSetStatus writes what the StatefulSet controller would into the status of the
// latest StatefulSet, again when the update races the operator's writes.
func updateStatefulSetStatus(key client.ObjectKey, change func(*appsv1.StatefulSet)) {
	Expect(retry.RetryOnConflict(retry.DefaultRetry, func() error {
		sts := &appsv1.StatefulSet{}
		if err := k8s.Get(ctx, key, sts); err != nil {
			return err
		}
		change(sts)
		return k8s.Status().Update(ctx, sts)
	})).To(Succeed())
}

func condition(conds []metav1.Condition, t string) metav1.Condition {
	if c := meta.FindStatusCondition(conds, t); c != nil {
		return *c
	}
	return metav1.Condition{}
}

var _ = Describe("ServerSet", func() {
	It("renders the engine StatefulSet, ConfigMap, headless Service and PDB", func() {
		ss := newServerSet("render", "127.0.0.1:1", 3)
		ss.Spec.Hugepages = ptr.To(resource.MustParse("512Mi"))
		ss.Spec.NodeSelector = map[string]string{"peregrine.dev/storage": "true"}
		ss.Spec.Fabric = storagev1.Fabric{Provider: "tcp", Interface: "eth1"}
		ss.Spec.FlushInterval = &metav1.Duration{Duration: 250 * time.Millisecond}
		Expect(k8s.Create(ctx, ss)).To(Succeed())

		sts := &appsv1.StatefulSet{}
		Eventually(func() error { return k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "render"}, sts) }).Should(Succeed())
		Expect(*sts.Spec.Replicas).To(Equal(int32(3)))
		Expect(sts.Spec.ServiceName).To(Equal("render"))
		Expect(sts.OwnerReferences).To(HaveLen(1))
		Expect(sts.OwnerReferences[0].Kind).To(Equal("ServerSet"))
		pod := sts.Spec.Template.Spec
		Expect(pod.NodeSelector).To(HaveKeyWithValue("peregrine.dev/storage", "true"))
		Expect(pod.Containers).To(HaveLen(1))
		c := pod.Containers[0]
		// Emulated NVMe (a file on a host directory): no privilege, no escalation, of all
		// capabilities IPC_LOCK alone (mlock and io_uring's registered buffers).
		Expect(c.SecurityContext.Privileged).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(c.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))
		Expect(c.SecurityContext.Capabilities.Add).To(ConsistOf(corev1.Capability("IPC_LOCK")))
		hp := corev1.ResourceName("hugepages-2Mi")
		Expect(c.Resources.Requests[hp]).To(Equal(resource.MustParse("512Mi")))
		Expect(c.Resources.Limits[hp]).To(Equal(resource.MustParse("512Mi")))
		Expect(c.Resources.Requests).To(HaveKey(corev1.ResourceMemory))
		Expect(c.VolumeMounts).To(ContainElement(HaveField("MountPath", "/dev/hugepages")))
		// The engine config has no fabric keys (engine/crates/engine/src/config.rs rejects unknown
		// ones): provider and interface reach the engine container as environment variables.
		Expect(c.Env).To(ContainElements(
			corev1.EnvVar{Name: "PEREGRINE_FABRIC_PROVIDER", Value: "tcp"},
			corev1.EnvVar{Name: "PEREGRINE_FABRIC_INTERFACE", Value: "eth1"},
		))
		vols := map[string]corev1.Volume{}
		for _, v := range pod.Volumes {
			vols[v.Name] = v
		}
		Expect(vols["hugepages"].EmptyDir.Medium).To(Equal(corev1.StorageMedium("HugePages-2Mi")))
		Expect(vols["devices"].HostPath.Path).To(Equal("/var/lib/peregrine"))
		Expect(vols["config"].ConfigMap.Name).To(Equal("render-config"))
		Expect(sts.Spec.Template.Annotations).To(HaveKey(configHashKey))
		// Metrics: the engine serves them on the port named "metrics" (the chart's PodMonitor and
		// the headless Service use the name; annotation-based scrapers the annotations).
		Expect(c.Ports).To(ContainElement(corev1.ContainerPort{Name: "metrics", ContainerPort: 9464, Protocol: corev1.ProtocolTCP}))
		Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "METRICS_PORT", Value: "9464"}))
		Expect(sts.Spec.Template.Annotations).To(And(
			HaveKeyWithValue("prometheus.io/scrape", "true"),
			HaveKeyWithValue("prometheus.io/port", "9464"),
			HaveKeyWithValue("prometheus.io/path", "/metrics"),
		))

		cm := &corev1.ConfigMap{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "render-config"}, cm)).To(Succeed())
		// The configuration all ranks share (the golden files of engine_config_test.go have its
		// exact text); each pod passes its own values as flags (startScript).
		cfg := parseEngineConfig(cm.Data[engineConfigKey])
		Expect(cfg.Name).To(Equal("render"))
		Expect(cfg.Targets).To(Equal(int32(2)))
		Expect(cfg.Hugepages).To(BeTrue())
		Expect(cfg.FlushIntervalMs).To(HaveValue(Equal(int64(250))))
		Expect(cfg.Scm).To(Equal(engineScm{Class: "ram", Size: "256MiB"}))
		Expect(cfg.Bdev).To(Equal(engineBdev{Class: "file", Size: "1GiB"}))
		Expect(cfg.MgmtSvcReplicas).To(Equal([]string{"render-0.render.default.svc:10001"}))
		Expect(c.Env).To(ContainElement(corev1.EnvVar{Name: "EMULATED_NVME_DIR", Value: "/var/lib/peregrine"}))
		Expect(cm.Data[startScriptKey]).To(ContainSubstring("ulimit -l unlimited"))
		Expect(cm.Data[startScriptKey]).To(ContainSubstring(`--metrics-listen "${host}:${METRICS_PORT}"`))
		Expect(cm.Data[startScriptKey]).To(ContainSubstring(`--bdev-path "${EMULATED_NVME_DIR}/${SERVICE_NAME}-nvme${rank}.img"`))
		Expect(cm.Data[startScriptKey]).NotTo(ContainSubstring("sed"))
		Expect(cm.Data[engineConfigKey]).NotTo(ContainSubstring("fabric"))
		Expect(cm.Data[engineConfigKey]).NotTo(ContainSubstring("eth1"))

		svc := &corev1.Service{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "render"}, svc)).To(Succeed())
		Expect(svc.Spec.ClusterIP).To(Equal(corev1.ClusterIPNone))
		Expect(svc.Spec.PublishNotReadyAddresses).To(BeTrue())
		Expect(svc.Spec.Ports).To(ContainElement(And(
			HaveField("Name", "metrics"), HaveField("Port", int32(9464)), HaveField("TargetPort", intstr.FromString("metrics")),
		)))

		pdb := &policyv1.PodDisruptionBudget{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "render"}, pdb)).To(Succeed())
		Expect(pdb.Spec.MaxUnavailable.IntValue()).To(Equal(1))

		By("reporting the unreachable management service instead of inventing a state")
		Eventually(func() metav1.Condition {
			return condition(getServerSet("render")().Status.Conditions, storagev1.ConditionReady)
		}).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "ManagementServiceUnreachable")))
		got := getServerSet("render")()
		Expect(got.Status.MgmtAddress).To(Equal("127.0.0.1:1"))
		Expect(got.Status.ReadyEngines).To(BeZero())
		Expect(got.Status.Engines).To(BeEmpty())

		By("refusing to scale down")
		updateServerSet("render", func(ss *storagev1.ServerSet) { ss.Spec.Engines = 2 })
		Eventually(func() metav1.Condition {
			return condition(getServerSet("render")().Status.Conditions, storagev1.ConditionProgressing)
		}).Should(HaveField("Reason", "ScaleDownRefused"))
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "render"}, sts)).To(Succeed())
		Expect(*sts.Spec.Replicas).To(Equal(int32(3)))
	})

	It("passes an NVMe device into the pod and derives the management address from the Service", func() {
		ss := newServerSet("nvme", "", 1)
		ss.Spec.Storage.Emulated = nil
		ss.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/disk/by-id/nvme-eui.0001"}
		sts := renderStatefulSet(ss, 1, 0, "h", "")
		var vol corev1.Volume
		for _, v := range sts.Spec.Template.Spec.Volumes {
			if v.Name == "nvme" {
				vol = v
			}
		}
		Expect(vol.HostPath).NotTo(BeNil())
		Expect(*vol.HostPath.Type).To(Equal(corev1.HostPathBlockDev))
		// A kernel block device: the device cgroup of an unprivileged container refuses it.
		Expect(sts.Spec.Template.Spec.Containers[0].SecurityContext).To(Equal(&corev1.SecurityContext{Privileged: ptr.To(true)}))
		cfg := renderEngineConfig(ss)
		Expect(cfg.Bdev).To(Equal(engineBdev{Class: "kdev", Device: "/dev/disk/by-id/nvme-eui.0001"}))
		Expect(cfg.Hugepages).To(BeFalse())
		Expect(mgmtAddress(ss)).To(Equal("nvme-0.nvme.default.svc:10001"))
	})

	It("formats a blank engine and reports it from the management service", func() {
		e := startEngine("blank", false)
		Expect(k8s.Create(ctx, newServerSet("blank", e.addr, 1))).To(Succeed())
		Eventually(func() int32 { return getServerSet("blank")().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(1)))
		ss := getServerSet("blank")()
		Expect(condition(ss.Status.Conditions, storagev1.ConditionReady).Status).To(Equal(metav1.ConditionTrue))
		Expect(condition(ss.Status.Conditions, storagev1.ConditionStorageFormatted).Status).To(Equal(metav1.ConditionTrue))
		Expect(ss.Status.Engines).To(HaveLen(1))
		Expect(ss.Status.Engines[0].State).To(Equal(storagev1.EngineJoined))
		Expect(ss.Status.Engines[0].Formatted).To(BeTrue())
		Expect(ss.Status.System).To(Equal("blank"))
		var nvme storagev1.TierStatus
		for _, t := range ss.Status.Capacity {
			if t.Name == "nvme" {
				nvme = t
			}
		}
		Expect(nvme.Total).To(BeNumerically(">", 0))
		Expect(nvme.Free).To(BeNumerically(">", 0))
	})

	It("does not format a device with a foreign signature until forced", func() {
		e := startEngine("foreign", true)
		Expect(k8s.Create(ctx, newServerSet("foreign", e.addr, 1))).To(Succeed())
		Eventually(func() metav1.Condition {
			return condition(getServerSet("foreign")().Status.Conditions, storagev1.ConditionStorageFormatted)
		}, 30*time.Second).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "FormatRefused"),
			HaveField("Message", ContainSubstring(storagev1.AnnotationForceFormat))))
		ss := getServerSet("foreign")()
		GinkgoWriter.Println("refusal:", condition(ss.Status.Conditions, storagev1.ConditionStorageFormatted).Message)
		Expect(strings.ToLower(condition(ss.Status.Conditions, storagev1.ConditionStorageFormatted).Message)).To(ContainSubstring("non-zero data"))
		Expect(ss.Status.ReadyEngines).To(BeZero())
		Expect(ss.Status.Engines).To(ConsistOf(HaveField("State", storagev1.EngineMaintenance)))
		Expect(condition(ss.Status.Conditions, storagev1.ConditionReady).Reason).To(Equal("FormatRefused"))

		By("forcing with the annotation")
		updateServerSet("foreign", func(ss *storagev1.ServerSet) { ss.Annotations[storagev1.AnnotationForceFormat] = "true" })
		Eventually(func() int32 { return getServerSet("foreign")().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(1)))
	})

	It("rolls a new template one engine at a time, holding while the system is not whole", func() {
		e := startEngine("roll", false)
		Expect(k8s.Create(ctx, newServerSet("roll", e.addr, 2))).To(Succeed())
		sts := &appsv1.StatefulSet{}
		key := client.ObjectKey{Namespace: "default", Name: "roll"}
		Eventually(func() error { return k8s.Get(ctx, key, sts) }, 20*time.Second).Should(Succeed())
		Expect(currentPartition(sts)).To(BeZero())

		By("a first start formats nothing until every engine has joined")
		Eventually(func() metav1.Condition {
			return condition(getServerSet("roll")().Status.Conditions, storagev1.ConditionStorageFormatted)
		}, 20*time.Second).Should(And(HaveField("Reason", "WaitingForEngines"), HaveField("Message", ContainSubstring("1 of 2 engines have joined"))))
		Expect(getServerSet("roll")().Status.Engines).To(ConsistOf(HaveField("State", storagev1.EngineMaintenance)))

		By("changing the image")
		updateServerSet("roll", func(ss *storagev1.ServerSet) { ss.Spec.Image = "peregrine:v2" })
		Eventually(func() int32 {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return currentPartition(sts)
		}, 20*time.Second).Should(Equal(int32(1)), "only the highest rank takes the new template first")
		Expect(sts.Spec.Template.Spec.Containers[0].Image).To(Equal("peregrine:v2"))

		By("rank 1 updated and every pod ready, but the management service sees one engine of two")
		updateStatefulSetStatus(key, func(sts *appsv1.StatefulSet) {
			sts.Status.Replicas, sts.Status.ReadyReplicas, sts.Status.UpdatedReplicas = 2, 2, 1
			sts.Status.ObservedGeneration = sts.Generation
		})
		Consistently(func() int32 {
			Expect(k8s.Get(ctx, key, sts)).To(Succeed())
			return currentPartition(sts)
		}, 4*time.Second, 500*time.Millisecond).Should(Equal(int32(1)))

		By("Progressing says what the roll waits for, rank by rank")
		Eventually(func() metav1.Condition {
			return condition(getServerSet("roll")().Status.Conditions, storagev1.ConditionProgressing)
		}, 10*time.Second).Should(And(HaveField("Status", metav1.ConditionTrue), HaveField("Reason", "WaitingForSystem"),
			HaveField("Message", And(ContainSubstring("rank 0: maintenance"), ContainSubstring("rank 1: not a member of the system")))))
	})
})

var _ = Describe("nextPartition", func() {
	base := rollState{replicas: 3, desiredHash: "b", previousHash: "b", observed: true}
	with := func(f func(*rollState)) rollState { s := base; f(&s); return s }
	DescribeTable("steps one engine at a time",
		func(s rollState, want int32) { Expect(nextPartition(s)).To(Equal(want)) },
		Entry("nothing to roll", base, int32(0)),
		Entry("a new template starts at the highest rank", with(func(s *rollState) { s.previousHash = "a" }), int32(2)),
		Entry("a single engine rolls at once", with(func(s *rollState) { s.previousHash = "a"; s.replicas = 1 }), int32(0)),
		Entry("waits for the updated pod", with(func(s *rollState) { s.partition = 2; s.ready = 3; s.systemHealthy = true }), int32(2)),
		Entry("waits for readiness", with(func(s *rollState) { s.partition = 2; s.updated = 1; s.ready = 2; s.systemHealthy = true }), int32(2)),
		Entry("waits for the system", with(func(s *rollState) { s.partition = 2; s.updated = 1; s.ready = 3 }), int32(2)),
		Entry("waits for the StatefulSet controller", with(func(s *rollState) {
			s.partition = 2
			s.updated = 1
			s.ready = 3
			s.systemHealthy = true
			s.observed = false
		}), int32(2)),
		Entry("steps down when all hold", with(func(s *rollState) { s.partition = 2; s.updated = 1; s.ready = 3; s.systemHealthy = true }), int32(1)),
		Entry("last step", with(func(s *rollState) { s.partition = 1; s.updated = 2; s.ready = 3; s.systemHealthy = true }), int32(0)),
		Entry("a newer template mid-roll restarts from the top", with(func(s *rollState) { s.partition = 1; s.previousHash = "a" }), int32(2)),
	)
})

var _ = Describe("formatFailure", func() {
	sys := &mgmtpb.SystemQueryResp{Members: []*mgmtpb.Member{
		{Rank: 0, ControlAddr: "10.0.0.1:10001"}, {Rank: 1, ControlAddr: "10.0.0.2:10001"}, {Rank: 2, ControlAddr: "10.0.0.3:10001"},
	}}
	fp := func(msg string) error { return status.Error(codes.FailedPrecondition, msg) }
	DescribeTable("names the cause the management service gave",
		func(err error, reason storagev1.ConditionReason, parts ...string) {
			got, msg := formatFailure(err, sys)
			Expect(got).To(Equal(reason))
			for _, p := range parts {
				Expect(msg).To(ContainSubstring(p))
			}
		},
		Entry("a foreign signature", fp("storage format: rank 2: format /dev/x: device /dev/x holds non-zero data at offset 4096; refusing to format it without force"),
			storagev1.ReasonFormatRefused, "non-zero data"),
		Entry("another system's format", fp("storage format: rank 2: format /dev/x: device /dev/x is already formatted (system a, rank 0); refusing to reformat without force"),
			storagev1.ReasonFormatRefused, "system a"),
		Entry("a stopped rank", fp("storage format: rank 1: engine is stopped"),
			storagev1.ReasonRankUnreachable, "cannot reach rank 1: storage format: rank 1: engine is stopped"),
		Entry("a rank whose control address does not answer", fp("storage format: engine at 10.0.0.2:10001: transport error; rank 0: engine is stopped"),
			storagev1.ReasonRankUnreachable, "cannot reach rank 0, rank 1: ", "engine at 10.0.0.2:10001: transport error"),
		Entry("an engine the system map does not know", fp("storage format: engine at 10.9.9.9:1: transport error"),
			storagev1.ReasonRankUnreachable, "cannot reach engine at 10.9.9.9:1: "),
		Entry("a foreign signature beside a stopped rank still asks for force", fp("storage format: rank 1: engine is stopped; rank 2: format /dev/x: device /dev/x holds an ext4 file system; refusing to format it without force"),
			storagev1.ReasonFormatRefused, "rank 1: engine is stopped", "ext4"),
		Entry("a busy rank", fp("storage format: rank 2: storage is busy with I/O; stop clients before a forced format"),
			storagev1.ReasonFormatFailed, "storage is busy"),
		Entry("no answer in time", status.Error(codes.DeadlineExceeded, "context deadline exceeded"),
			storagev1.ReasonFormatFailed, "storage format: context deadline exceeded (DeadlineExceeded)"),
	)
})

var _ = Describe("ServerSet status from the management service", func() {
	It("reports a rank whose storage refuses updates as Degraded, with the engine's reason", func() {
		ss := &storagev1.ServerSet{}
		ss.Spec.Engines = 2
		sys := &mgmtpb.SystemQueryResp{System: "s", Members: []*mgmtpb.Member{
			{Rank: 0, State: mgmtpb.MemberState_MEMBER_STATE_JOINED}, {Rank: 1, State: mgmtpb.MemberState_MEMBER_STATE_JOINED},
		}}
		scan := &mgmtpb.StorageScanResp{Ranks: []*mgmtpb.RankStorage{
			{Rank: 0, Formatted: true, System: "s", State: mgmtpb.StorageState_STORAGE_STATE_READY},
			{Rank: 1, Formatted: true, System: "s", State: mgmtpb.StorageState_STORAGE_STATE_DEGRADED,
				Message: "target 1: a device write failed (No space left on device (os error 28))"},
		}}
		copySystemStatus(ss, sys, scan)
		Expect(ss.Status.Engines[1].StorageState).To(Equal(storagev1.StorageDegraded))
		r := &ServerSetReconciler{}
		r.setConditions(ss, nil, 2, "", nil)
		c := meta.FindStatusCondition(ss.Status.Conditions, storagev1.ConditionDegraded)
		Expect(c).NotTo(BeNil())
		Expect(c.Status).To(Equal(metav1.ConditionTrue))
		Expect(c.Message).To(ContainSubstring("rank 1 degraded: target 1: a device write failed"))

		scan.Ranks[1].State, scan.Ranks[1].Message = mgmtpb.StorageState_STORAGE_STATE_READY, ""
		copySystemStatus(ss, sys, scan)
		r.setConditions(ss, nil, 2, "", nil)
		Expect(meta.IsStatusConditionFalse(ss.Status.Conditions, storagev1.ConditionDegraded)).To(BeTrue())
	})
})
