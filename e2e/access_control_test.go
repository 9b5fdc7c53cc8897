package e2e

import (
	"context"
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

// Access control, the Kubernetes side (docs/access-control.md): a Pool whose allowedNamespaces
// names this run's namespace. The CSI controller refuses to provision in it for a PVC of
// another namespace (the PVC stays Pending, its ProvisioningFailed event names the namespace,
// the pool and the property); a PVC of the allowed namespace binds and its pod mounts it. Then
// the Pool is narrowed to one service account: the node plugin, which asks the store at every
// mount, refuses a pod of the default service account and mounts one of the named account.

const (
	guardedPool  = "guarded"
	guardedClass = "peregrine-e2e-guarded"
	guardedSA    = "guarded-sa"
)

// newGuardedPVC is a 64 MiB RWX claim of the guarded class.
func newGuardedPVC(namespace, name string) *corev1.PersistentVolumeClaim {
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteMany},
			StorageClassName: ptr.To(guardedClass),
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("64Mi")}},
		},
	}
}

// eventsOf lists the messages of the events about one object with reason, newest last.
func eventsOf(ctx context.Context, g Gomega, namespace, kind, name, reason string) []string {
	var list corev1.EventList
	g.Expect(k8s.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
	var out []string
	for _, e := range list.Items {
		if e.InvolvedObject.Kind == kind && e.InvolvedObject.Name == name && e.Reason == reason {
			out = append(out, e.Message)
		}
	}
	return out
}

// deleteClaimAndVolume deletes a PVC and waits until its PV (reclaim policy Delete) is gone too:
// the container behind it is then destroyed, and its pool may go.
func deleteClaimAndVolume(ctx context.Context, pvc *corev1.PersistentVolumeClaim) {
	pv := ""
	if err := k8s.Get(ctx, client.ObjectKeyFromObject(pvc), pvc); err == nil {
		pv = pvc.Spec.VolumeName
	}
	deleteAndWait(ctx, pvc)
	if pv != "" {
		Eventually(func() bool {
			return apierrors.IsNotFound(k8s.Get(ctx, client.ObjectKey{Name: pv}, &corev1.PersistentVolume{}))
		}, 3*time.Minute).Should(BeTrue(), "PV %s of %s/%s", pv, pvc.Namespace, pvc.Name)
	}
}

func accessControlSpecs(ctx context.Context) {
	It("keeps a pool restricted to one namespace from the PVCs and pods of others", func() {
		other := ns + "-other"
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}}))).To(Succeed())
		DeferCleanup(func() {
			_ = k8s.Delete(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: other}})
		})

		pool := &storagev1.Pool{
			ObjectMeta: metav1.ObjectMeta{Name: guardedPool, Namespace: storeNS},
			Spec: storagev1.PoolSpec{ServerSetRef: storagev1.LocalObjectReference{Name: storeName}, Label: guardedPool, Size: "512MiB",
				AllowedNamespaces: storagev1.AllowedNamespaces{storagev1.NamespaceOrServiceAccount(ns)}},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, pool))).To(Succeed())
		// Last: the claims' containers must be gone first (DeferCleanup runs in reverse order).
		DeferCleanup(func() {
			p := &storagev1.Pool{ObjectMeta: metav1.ObjectMeta{Name: guardedPool, Namespace: storeNS}}
			deleteAndWait(context.Background(), p)
		})
		Eventually(func(g Gomega) {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pool), pool)).To(Succeed())
			g.Expect(ready(pool.Status.Conditions)).To(BeTrue(), "%v", pool.Status.Conditions)
		}).Should(Succeed())
		// A previous run may have left the pool narrowed: back to the namespace.
		Expect(updatePool(ctx, pool, func(p *storagev1.Pool) {
			p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{storagev1.NamespaceOrServiceAccount(ns)}
		})).To(Succeed())

		sc := &storagek8s.StorageClass{
			ObjectMeta:  metav1.ObjectMeta{Name: guardedClass},
			Provisioner: driverName,
			Parameters:  map[string]string{"pool": guardedPool, "oclass": "S1"},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sc))).To(Succeed())
		DeferCleanup(func() { _ = k8s.Delete(context.Background(), sc) })

		By("a PVC of another namespace stays Pending, and its event says why")
		refused := newGuardedPVC(other, "guarded")
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, refused))).To(Succeed())
		DeferCleanup(deleteClaimAndVolume, context.Background(), refused)
		Eventually(func(g Gomega) []string {
			return eventsOf(ctx, g, other, "PersistentVolumeClaim", refused.Name, "ProvisioningFailed")
		}).Should(ContainElement(And(
			ContainSubstring("PermissionDenied"), ContainSubstring(`namespace "`+other+`"`),
			ContainSubstring(`pool "`+guardedPool+`"`), ContainSubstring(storagev1.PropAllowedNamespaces))))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(refused), refused)).To(Succeed())
		Expect(refused.Status.Phase).To(Equal(corev1.ClaimPending))
		Expect(refused.Spec.VolumeName).To(BeEmpty())

		By("a PVC of the allowed namespace binds, and a pod mounts it")
		allowed := newGuardedPVC(ns, "guarded")
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, allowed))).To(Succeed())
		DeferCleanup(deleteClaimAndVolume, context.Background(), allowed)
		Eventually(func(g Gomega) corev1.PersistentVolumeClaimPhase {
			g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(allowed), allowed)).To(Succeed())
			return allowed.Status.Phase
		}).Should(Equal(corev1.ClaimBound))
		Expect(runPod("guarded-writer", allowed.Name, nil, `echo guarded > /data/f && cat /data/f`)).To(ContainSubstring("guarded"))

		By("narrowed to one service account, the pool refuses a pod of another at mount")
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: guardedSA, Namespace: ns}}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sa))).To(Succeed())
		since := metav1.Now().Rfc3339Copy()
		Expect(updatePool(ctx, pool, func(p *storagev1.Pool) {
			p.Spec.AllowedNamespaces = storagev1.AllowedNamespaces{storagev1.NamespaceOrServiceAccount(ns + "/" + guardedSA)}
		})).To(Succeed())
		// The operator has set the property once it says so.
		Eventually(func(g Gomega) bool {
			var list corev1.EventList
			g.Expect(k8s.List(ctx, &list, client.InNamespace(storeNS))).To(Succeed())
			for _, e := range list.Items {
				if e.InvolvedObject.Kind == "Pool" && e.InvolvedObject.Name == guardedPool && e.Reason == "PropertiesSet" &&
					strings.Contains(e.Message, storagev1.PropAllowedNamespaces) && !e.LastTimestamp.Before(&since) {
					return true
				}
			}
			return false
		}).Should(BeTrue(), "a PropertiesSet event of pool %s naming %s", guardedPool, storagev1.PropAllowedNamespaces)

		pod := guardedPod("guarded-default-sa", "", allowed.Name)
		deletePodAndWait(pod.Name)
		Expect(k8s.Create(ctx, pod)).To(Succeed())
		DeferCleanup(deletePodAndWait, pod.Name)
		Eventually(func(g Gomega) []string {
			return eventsOf(ctx, g, ns, "Pod", pod.Name, "FailedMount")
		}).Should(ContainElement(And(
			ContainSubstring("PermissionDenied"), ContainSubstring(`service account "default" of namespace "`+ns+`"`),
			ContainSubstring(`pool "`+guardedPool+`"`))))
		Expect(k8s.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
		Expect(pod.Status.Phase).To(Equal(corev1.PodPending), "a refused mount keeps the pod from starting")
		deletePodAndWait(pod.Name)

		By("a pod of the allowed service account mounts it")
		Expect(runPodSpec(guardedPod("guarded-allowed-sa", guardedSA, allowed.Name))).To(ContainSubstring("guarded"))
	})
}

// guardedPod is a one-shot pod of service account sa ("": the namespace's default) that reads
// what guarded-writer wrote on the claim.
func guardedPod(name, sa, claim string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ServiceAccountName:            sa,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			Containers: []corev1.Container{{
				Name: "main", Image: toolsImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:      []string{"/bin/sh", "-ec", "cat /data/f"},
				VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
			}},
			Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
				PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}},
		},
	}
}

// updatePool applies mutate to the fresh Pool and updates it, again on a conflict with the
// operator's own writes.
func updatePool(ctx context.Context, pool *storagev1.Pool, mutate func(*storagev1.Pool)) error {
	for {
		if err := k8s.Get(ctx, client.ObjectKeyFromObject(pool), pool); err != nil {
			return err
		}
		mutate(pool)
		if err := k8s.Update(ctx, pool); !apierrors.IsConflict(err) {
			return err
		}
	}
}
