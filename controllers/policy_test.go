package controllers

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// The suite's operator runs with DefaultEnginePolicy plus the image prefix "peregrine:"
// (suite_test.go): what it refuses, it refuses through the real API server's status.
var _ = Describe("Engine policy", func() {
	// refused creates a ServerSet and waits for its NotAllowed conditions; nothing is rendered.
	refused := func(ss *storagev1.ServerSet, field string) metav1.Condition {
		Expect(k8s.Create(ctx, ss)).To(Succeed())
		var ready metav1.Condition
		Eventually(func() metav1.Condition {
			ready = condition(getServerSet(ss.Name)().Status.Conditions, storagev1.ConditionReady)
			return ready
		}).Should(And(HaveField("Status", metav1.ConditionFalse), HaveField("Reason", "NotAllowed")))
		Expect(ready.Message).To(HavePrefix(field+": "), "the message names the field")
		Expect(condition(getServerSet(ss.Name)().Status.Conditions, storagev1.ConditionProgressing)).
			To(HaveField("Reason", "NotAllowed"))
		Expect(getServerSet(ss.Name)().Status.ObservedGeneration).To(Equal(getServerSet(ss.Name)().Generation))
		Consistently(func() bool {
			err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: ss.Name}, &appsv1.StatefulSet{})
			return apierrors.IsNotFound(err)
		}, "2s").Should(BeTrue(), "a refused ServerSet renders no StatefulSet")
		err := k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: configMapName(ss)}, &corev1.ConfigMap{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "nor a ConfigMap")
		events := &corev1.EventList{}
		Eventually(func() []corev1.Event {
			Expect(k8s.List(ctx, events, client.InNamespace("default"))).To(Succeed())
			var mine []corev1.Event
			for _, e := range events.Items {
				if e.InvolvedObject.Name == ss.Name && e.Reason == "NotAllowed" && e.Type == corev1.EventTypeWarning {
					mine = append(mine, e)
				}
			}
			return mine
		}).ShouldNot(BeEmpty(), "a Warning event says why")
		return ready
	}

	It("refuses an engine image outside --allowed-images, naming spec.image", func() {
		ss := newServerSet("bad-image", "127.0.0.1:1", 1)
		ss.Spec.Image = "evil.example.com/peregrine/engine:dev"
		c := refused(ss, "spec.image")
		Expect(c.Message).To(ContainSubstring(`"evil.example.com/peregrine/engine:dev"`))
		Expect(c.Message).To(ContainSubstring("--allowed-images (peregrine/engine:, peregrine/engine@, peregrine:)"))

		By("rendering it once the image is allowed")
		updateServerSet("bad-image", func(ss *storagev1.ServerSet) { ss.Spec.Image = "peregrine/engine:dev" })
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "bad-image"}, &appsv1.StatefulSet{})
		}).Should(Succeed())
		Eventually(func() string {
			return condition(getServerSet("bad-image")().Status.Conditions, storagev1.ConditionReady).Reason
		}).Should(Equal("ManagementServiceUnreachable"))
	})

	It("refuses a repository that only shares the allowed one's prefix", func() {
		ss := newServerSet("look-alike", "127.0.0.1:1", 1)
		ss.Spec.Image = "peregrine/engine-evil:dev"
		refused(ss, "spec.image")
	})

	It("refuses an emulated hostPath outside --allowed-host-paths, naming the field", func() {
		ss := newServerSet("bad-hostpath", "127.0.0.1:1", 1)
		ss.Spec.Storage.Emulated.HostPath = "/etc"
		c := refused(ss, "spec.storage.emulated.hostPath")
		Expect(c.Message).To(ContainSubstring(`host path "/etc" is not one of, or below, the operator's --allowed-host-paths (/var/lib/peregrine)`))
	})

	It("refuses a sibling directory and a path that climbs out of an allowed one", func() {
		ss := newServerSet("sibling", "127.0.0.1:1", 1)
		ss.Spec.Storage.Emulated.HostPath = "/var/lib/peregrine-other"
		refused(ss, "spec.storage.emulated.hostPath")
		ss = newServerSet("climb", "127.0.0.1:1", 1)
		ss.Spec.Storage.Emulated.HostPath = "/var/lib/peregrine/../../../etc"
		c := refused(ss, "spec.storage.emulated.hostPath")
		Expect(c.Message).To(ContainSubstring("'..'"))
	})

	It("refuses a device outside --allowed-devices, naming spec.storage.nvme.device", func() {
		ss := newServerSet("bad-device", "127.0.0.1:1", 1)
		ss.Spec.Storage.Emulated = nil
		ss.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/sda"}
		c := refused(ss, "spec.storage.nvme.device")
		Expect(c.Message).To(ContainSubstring(`device "/dev/sda" does not start with one of the operator's --allowed-devices`))
	})

	It("names every refused field at once", func() {
		ss := newServerSet("all-bad", "127.0.0.1:1", 1)
		ss.Spec.Image = "other/engine:1"
		ss.Spec.Storage.Emulated.HostPath = "/root"
		c := refused(ss, "spec.image")
		Expect(strings.Split(c.Message, "; ")).To(HaveLen(2))
		Expect(c.Message).To(ContainSubstring("spec.storage.emulated.hostPath: Forbidden"))
	})

	It("runs an allowed device privileged and an allowed emulated one unprivileged", func() {
		dev := newServerSet("allowed-nvme", "127.0.0.1:1", 1)
		dev.Spec.Storage.Emulated = nil
		dev.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/nvme0n1"}
		Expect(k8s.Create(ctx, dev)).To(Succeed())
		emu := newServerSet("allowed-emulated", "127.0.0.1:1", 1)
		emu.Spec.Storage.Emulated.HostPath = "/var/lib/peregrine/sub/dir"
		Expect(k8s.Create(ctx, emu)).To(Succeed())
		sts := &appsv1.StatefulSet{}
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "allowed-nvme"}, sts)
		}).Should(Succeed())
		Expect(sts.Spec.Template.Spec.Containers[0].SecurityContext.Privileged).To(HaveValue(BeTrue()))
		Eventually(func() error {
			return k8s.Get(ctx, client.ObjectKey{Namespace: "default", Name: "allowed-emulated"}, sts)
		}).Should(Succeed())
		sc := sts.Spec.Template.Spec.Containers[0].SecurityContext
		Expect(sc.Privileged).To(HaveValue(BeFalse()))
		Expect(sc.AllowPrivilegeEscalation).To(HaveValue(BeFalse()))
		Expect(sc.Capabilities.Add).To(ConsistOf(corev1.Capability("IPC_LOCK")))
	})
})

var _ = Describe("EnginePolicy.Validate", func() {
	It("refuses entries that would match more than meant", func() {
		for _, p := range []EnginePolicy{
			{AllowedImages: []string{"registry.example.com"}},
			{AllowedImages: []string{""}},
			{AllowedHostPaths: []string{"/"}},
			{AllowedHostPaths: []string{"var/lib"}},
			{AllowedHostPaths: []string{"/var/lib/../etc"}},
			{AllowedHostPaths: []string{"/var/lib/"}},
			{AllowedDevices: []string{"/etc/"}},
			{AllowedDevices: []string{"/dev/../etc"}},
		} {
			Expect(p.Validate()).To(HaveOccurred(), "%+v", p)
		}
		Expect(DefaultEnginePolicy().Validate()).To(Succeed())
		Expect(EnginePolicy{AllowedImages: []string{"registry.example.com/", "a/b:", "a/b@"}}.Validate()).To(Succeed())
	})
})
