package e2e

// The node agent (issue 20, point 2; docs/access-control.md): the chart's peregrine-agent
// DaemonSet serves /run/peregrine/agent.sock on every node with the node's client certificate.
// Pods without a certificate of their own reach the store through it, and the ACLs see the uid
// the kernel gives the socket: here the CLI of the engine image, run as uid 1000 (whom the
// container's ACL lets write), uid 1001 (read only) and uid 1002 (not named), with no
// certificate and with nothing in its environment but the socket.

import (
	"context"
	"regexp"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

const (
	agentPool = "agent"
	agentCont = "agent-users"
	// agentSocketDir is the chart's agent.socketDir.
	agentSocketDir = "/run/peregrine"
)

// agentPod runs script as uid with the node's agent directory mounted (hostPath) and
// PEREGRINE_AGENT_SOCKET naming its socket, from the engine image (which has the CLI).
func agentPod(name string, uid int64, script string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			SecurityContext:              &corev1.PodSecurityContext{RunAsUser: ptr.To(uid), RunAsGroup: ptr.To(uid)},
			Containers: []corev1.Container{{
				Name: "main", Image: engineImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command: []string{"/bin/sh", "-c", script},
				Env:     []corev1.EnvVar{{Name: "PEREGRINE_AGENT_SOCKET", Value: agentSocketDir + "/agent.sock"}},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: []corev1.VolumeMount{{Name: "agent", MountPath: agentSocketDir}},
			}},
			Volumes: []corev1.Volume{{Name: "agent", VolumeSource: corev1.VolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: agentSocketDir, Type: ptr.To(corev1.HostPathDirectory)},
			}}},
		},
	}
}

func agentSpecs(ctx context.Context) {
	It("lets pods without a certificate reach containers through the node agent, as the uid the kernel names", func() {
		By("the agent DaemonSet is ready on every node")
		Eventually(func(g Gomega) {
			ds := &appsv1.DaemonSet{}
			g.Expect(k8s.Get(ctx, client.ObjectKey{Namespace: releaseNS, Name: "peregrine-agent"}, ds)).To(Succeed())
			g.Expect(ds.Status.DesiredNumberScheduled).To(BeNumerically(">", 0))
			g.Expect(ds.Status.NumberReady).To(Equal(ds.Status.DesiredNumberScheduled))
		}).Should(Succeed())

		By("a pool everyone may connect to, and a container uid 1000 writes and uid 1001 reads")
		pool := &storagev1.Pool{
			ObjectMeta: metav1.ObjectMeta{Name: agentPool, Namespace: storeNS},
			Spec: storagev1.PoolSpec{ServerSetRef: storagev1.LocalObjectReference{Name: storeName}, Label: agentPool, Size: "256MiB",
				ACL: "A::OWNER@:rwa,A::EVERYONE@:r"},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, pool))).To(Succeed())
		// Last: the container must be gone first (DeferCleanup runs in reverse order).
		DeferCleanup(func() {
			deleteAndWait(context.Background(), &storagev1.Pool{ObjectMeta: metav1.ObjectMeta{Name: agentPool, Namespace: storeNS}})
		})
		cont := &storagev1.Container{
			ObjectMeta: metav1.ObjectMeta{Name: agentCont, Namespace: storeNS},
			Spec: storagev1.ContainerSpec{PoolRef: storagev1.LocalObjectReference{Name: agentPool}, ObjectClass: "S1",
				ACL: "A::OWNER@:rwa,A::1000@:rw,A::1001@:r"},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, cont))).To(Succeed())
		DeferCleanup(func() {
			deleteAndWait(context.Background(), &storagev1.Container{ObjectMeta: metav1.ObjectMeta{Name: agentCont, Namespace: storeNS}})
		})
		for _, o := range []client.Object{pool, cont} {
			Eventually(func(g Gomega) {
				g.Expect(k8s.Get(ctx, client.ObjectKeyFromObject(o), o)).To(Succeed())
				var conds []metav1.Condition
				switch v := o.(type) {
				case *storagev1.Pool:
					conds = v.Status.Conditions
				case *storagev1.Container:
					conds = v.Status.Conditions
				}
				g.Expect(ready(conds)).To(BeTrue(), "%s: %v", o.GetName(), conds)
			}).Should(Succeed())
		}

		// Each step prints "== NAME rc=N"; the CLI takes PEREGRINE_AGENT_SOCKET for --agent.
		const steps = `
run() { name=$1; shift; echo "== $name: $*"; if "$@" 2>&1; then echo; echo "== $name rc=0"; else echo "== $name rc=$?"; fi; }
O="` + agentPool + ` ` + agentCont + ` S1:0.42"
`
		By("uid 1000 writes and reads back; uid 1001 reads and may not write; uid 1002 may not open")
		writer := runPodSpec(agentPod("agent-uid-1000", 1000, steps+`
run put peregrine obj put $O d a --value "written by 1000"
run get peregrine obj get $O d a
`))
		reader := runPodSpec(agentPod("agent-uid-1001", 1001, steps+`
run get peregrine obj get $O d a
run put peregrine obj put $O d a --value "written by 1001"
`))
		stranger := runPodSpec(agentPod("agent-uid-1002", 1002, steps+`
run get peregrine obj get $O d a
`))
		rc := func(logs string) map[string]string {
			m := map[string]string{}
			for _, s := range regexp.MustCompile(`(?m)^== (\S+) rc=(\d+)$`).FindAllStringSubmatch(logs, -1) {
				m[s[1]] = s[2]
			}
			return m
		}
		Expect(rc(writer)).To(Equal(map[string]string{"put": "0", "get": "0"}), writer)
		Expect(writer).To(ContainSubstring("written by 1000"))
		Expect(rc(reader)).To(HaveKeyWithValue("get", "0"), reader)
		Expect(reader).To(ContainSubstring("written by 1000"))
		Expect(rc(reader)).To(HaveKey("put"), reader)
		Expect(rc(reader)["put"]).NotTo(Equal("0"), "a reader's write must be refused:\n%s", reader)
		Expect(rc(stranger)).To(HaveKey("get"), stranger)
		Expect(rc(stranger)["get"]).NotTo(Equal("0"), "a uid the ACL does not name must be refused:\n%s", stranger)
		Expect(stranger).To(ContainSubstring("1002"), "the refusal names the caller:\n%s", stranger)
	})
}
