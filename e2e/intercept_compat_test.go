package e2e

import (
	"context"
	"fmt"
	"io"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Images whose C library cannot take the interception library (hack/images.sh testimages builds
// them from hack/il-test-roots.sh: Debian 11's coreutils on glibc 2.31; a musl program and
// busybox-static).
var (
	oldGlibcImage = envOr("E2E_OLD_GLIBC_IMAGE", "peregrine/e2e-glibc2.31:dev")
	muslImage     = envOr("E2E_MUSL_IMAGE", "peregrine/e2e-musl:dev")
)

// checkLog is the one line of a pod's first check container.
func checkLog(ctx context.Context, pod string) string {
	r, err := cs.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: "peregrine-il-check-0"}).Stream(ctx)
	Expect(err).NotTo(HaveOccurred())
	defer r.Close()
	b, err := io.ReadAll(r)
	Expect(err).NotTo(HaveOccurred())
	return strings.TrimSpace(string(b))
}

// interceptCompatSpecs: annotated pods whose images cannot bind the library start and read the
// shared PVC's data through the kernel path; the check container says why. Needs the 1 GiB blob of
// the RWX spec.
func interceptCompatSpecs(ctx context.Context) {
	It("starts annotated pods whose images have an older glibc or musl, without interception", func() {
		want := strings.Fields(runPod("checksum", "shared", nil, `cat /data/run/blob.sha256`))[0]
		for _, tc := range []struct {
			name, image string
			command     []string
			reason      string
		}{
			{"old-glibc", oldGlibcImage, []string{"/usr/bin/sha256sum", "/data/run/blob"}, "version `GLIBC_2.3"},
			// /bin/true is musl's: its loader starts with the library missing; sh is static.
			{"musl", muslImage, []string{"/bin/sh", "-c", "/bin/true && sha256sum /data/run/blob"}, "is not glibc"},
		} {
			By(tc.name)
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: tc.name, Namespace: ns, Annotations: map[string]string{
					"peregrine.dev/intercept": "true", "peregrine.dev/intercept-report": "true"}},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name: "main", Image: tc.image, ImagePullPolicy: corev1.PullIfNotPresent,
						Command:      tc.command,
						VolumeMounts: []corev1.VolumeMount{{Name: "data", MountPath: "/data"}},
					}},
					Volumes: []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "shared"}}}},
				},
			}
			logs := runPodSpec(pod)
			Expect(logs).To(HavePrefix(want), "the pod read other data")
			Expect(logs).NotTo(ContainSubstring("ld.so"), "the loader complained")
			Expect(logs).NotTo(ContainSubstring("peregrine-il["), "the library reported, so it was loaded")
			line := checkLog(ctx, tc.name)
			Expect(line).To(HavePrefix("peregrine-il: interception off: "))
			Expect(line).To(ContainSubstring(tc.reason))
			fmt.Fprintf(GinkgoWriter, "%s: %s\n", tc.name, line)
		}
	})
}
