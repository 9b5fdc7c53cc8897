package controllers

import (
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// The API server refuses bad manifests with a message naming the field (OpenAPI and CEL rules in
// the generated CRDs).
var _ = Describe("Validation by the API server", func() {
	refused := func(obj client.Object, field, text string) {
		err := k8s.Create(ctx, obj)
		Expect(err).To(HaveOccurred(), "%s should be refused", field)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), err.Error())
		Expect(err.Error()).To(And(ContainSubstring(field), ContainSubstring(text)))
		GinkgoWriter.Println(err.Error())
	}

	It("refuses a bad size", func() {
		refused(newPool("bad-size", "tank", "10XB"), "spec.size", "should match")
	})
	It("refuses both a total size and per-tier sizes", func() {
		p := newPool("both-sizes", "tank", "1GiB")
		p.Spec.ScmSize, p.Spec.NvmeSize = "1GiB", "4GiB"
		refused(p, "spec", "give either size or scmSize/nvmeSize")
	})
	It("refuses an unknown object class", func() {
		c := newContainer("bad-class", "alpha")
		c.Spec.ObjectClass = "S3"
		refused(c, "spec.objectClass", "Unsupported value")
	})
	It("refuses an unknown sync mode", func() {
		c := newContainer("bad-sync", "alpha")
		c.Spec.Sync = "never"
		refused(c, "spec.sync", "Unsupported value")
	})
	It("refuses a redundancy factor of 5", func() {
		p := newPool("rf5", "tank", "1GiB")
		p.Spec.RedundancyFactor = ptrInt32(5)
		refused(p, "spec.redundancyFactor", "less than or equal to 4")
		c := newContainer("rf5", "alpha")
		c.Spec.RedundancyFactor = ptrInt32(5)
		refused(c, "spec.redundancyFactor", "less than or equal to 4")
	})
	It("refuses pool properties outside user.*", func() {
		p := newPool("props", "tank", "1GiB")
		p.Spec.Properties = map[string]string{"rf": "2"}
		refused(p, "spec.properties", "must start with 'user.'")
	})
	It("refuses a malformed ACL, naming the rule it breaks", func() {
		for acl, text := range map[string]string{
			"A::OWNER@:rwx":             "want entries A:<flags>:<principal>:<perms>",
			"A::OWNER@:rwa,":            "want entries A:<flags>:<principal>:<perms>",
			"D::OWNER@:r":               "want entries A:<flags>:<principal>:<perms>",
			"A::alice:r":                "want entries A:<flags>:<principal>:<perms>",
			"A::OWNER@:":                "want entries A:<flags>:<principal>:<perms>",
			"A::OWNER@:rwa, A::bob@:r":  "want entries A:<flags>:<principal>:<perms>",
			"A::OWNER@:rwa,A::GROUP@:r": "GROUP@ takes the flag G",
			"A:G:EVERYONE@:r":           "OWNER@ and EVERYONE@ take none",
			"A::OWNER@:rwr":             "names a permission twice",
		} {
			p := newPool("bad-acl", "tank", "1GiB")
			p.Spec.ACL = storagev1.ACL(acl)
			refused(p, "spec.acl", text)
			c := newContainer("bad-acl", "alpha")
			c.Spec.ACL = storagev1.ACL(acl)
			refused(c, "spec.acl", text)
		}
	})
	It("accepts a well-formed ACL", func() {
		p := newPool("good-acl", "nowhere", "1GiB")
		p.Spec.ACL = "A::OWNER@:rwa,A:G:GROUP@:rw,A::EVERYONE@:r,A::alice@:ar,A:G:staff@:w"
		Expect(k8s.Create(ctx, p, client.DryRunAll)).To(Succeed())
	})
	It("refuses an owner or group without its @", func() {
		p := newPool("bad-owner", "tank", "1GiB")
		p.Spec.Owner = "alice"
		refused(p, "spec.owner", "should match")
		c := newContainer("bad-group", "alpha")
		c.Spec.Group = "sta ff@"
		refused(c, "spec.group", "should match")
	})
	It("refuses an allowed namespace that is no namespace or service account", func() {
		for _, bad := range []string{"Team-A", "team-a/", "a/b/c", "*", "-team"} {
			p := newPool("bad-ns", "tank", "1GiB")
			p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{storagev1.NamespaceOrServiceAccount(bad)}
			refused(p, "spec.allowedNamespaces[0]", "should match")
		}
		c := newContainer("dup-ns", "alpha")
		c.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-a", "team-a"}
		refused(c, "spec.allowedNamespaces[1]", "Duplicate value")
	})
	It("refuses allowedNamespaces together with the property it sets", func() {
		p := newPool("both-ns", "tank", "1GiB")
		p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{"team-a"}
		p.Spec.Properties = map[string]string{storagev1.PropAllowedNamespaces: "team-b"}
		refused(p, "spec.allowedNamespaces", "not both")
	})
	It("refuses a ServerSet with both NVMe and emulated storage", func() {
		ss := newServerSet("two-devices", "127.0.0.1:1", 1)
		ss.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/nvme0n1"}
		refused(ss, "spec.storage", "exactly one of nvme and emulated")
	})
	It("refuses a flush interval beyond a minute", func() {
		ss := newServerSet("slow-flush", "127.0.0.1:1", 1)
		ss.Spec.FlushInterval = &metav1.Duration{Duration: 2 * time.Minute}
		refused(ss, "spec.flushInterval", "between 1ms and 60s")
	})
	It("refuses a metrics port that is the control port", func() {
		ss := newServerSet("metrics-port", "127.0.0.1:1", 1)
		ss.Spec.MetricsPort = 10001
		refused(ss, "spec.metricsPort", "must differ from controlPort and dataPort")
	})
	It("refuses changes to immutable fields", func() {
		// A ServerSet that does not exist: the objects stay unreconciled and are easy to delete.
		p := newPool("immutable", "nowhere", "1GiB")
		Expect(k8s.Create(ctx, p)).To(Succeed())
		err := updateFresh(p, func() { p.Spec.Size = "2GiB" })
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(And(ContainSubstring("spec.size"), ContainSubstring("size is immutable")))

		c := newContainer("immutable", "nowhere")
		Expect(k8s.Create(ctx, c)).To(Succeed())
		err = updateFresh(c, func() { c.Spec.ObjectClass = "EC_2P1G1" })
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
		Expect(err.Error()).To(And(ContainSubstring("spec.objectClass"), ContainSubstring("objectClass is immutable")))

		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Expect(k8s.Delete(ctx, c)).To(Succeed())
		Eventually(gone(p), 10*time.Second).Should(BeTrue())
		Eventually(gone(c), 10*time.Second).Should(BeTrue())
	})
})

// updateFresh re-reads obj, applies mutate and updates, until the update is not a conflict with
// the reconcilers' own writes; it returns the final error.
func updateFresh(obj client.Object, mutate func()) error {
	for {
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(obj), obj)).To(Succeed())
		mutate()
		if err := k8s.Update(ctx, obj); !apierrors.IsConflict(err) {
			return err
		}
	}
}
