package webhook

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func testPod(annotations map[string]string, containers ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: containers},
	}
}

func ctr(name string, env ...corev1.EnvVar) corev1.Container {
	return corev1.Container{Name: name, Image: "busybox", Env: env}
}

func envValue(c corev1.Container, name string) (string, int) {
	v, n := "", 0
	for _, e := range c.Env {
		if e.Name == name {
			v, n = e.Value, n+1
		}
	}
	return v, n
}

// assertPatched: the container has exactly one read-only mount of the volume at MountPath and
// LD_PRELOAD ending in the library (once).
func assertPatched(t *testing.T, c corev1.Container, wantPreload string) {
	t.Helper()
	mounts := 0
	for _, m := range c.VolumeMounts {
		if m.MountPath == MountPath {
			mounts++
			if m.Name != VolumeName || !m.ReadOnly {
				t.Errorf("container %s: mount %+v, want %s read-only", c.Name, m, VolumeName)
			}
		}
	}
	if mounts != 1 {
		t.Errorf("container %s: %d mounts at %s, want 1", c.Name, mounts, MountPath)
	}
	v, n := envValue(c, "LD_PRELOAD")
	if n != 1 || v != wantPreload {
		t.Errorf("container %s: LD_PRELOAD %q (%d entries), want %q once", c.Name, v, n, wantPreload)
	}
}

func assertUntouched(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		if m.Name == VolumeName {
			t.Errorf("container %s: has mount %+v", c.Name, m)
		}
	}
	if v, n := envValue(c, "LD_PRELOAD"); n != 0 {
		t.Errorf("container %s: has LD_PRELOAD %q", c.Name, v)
	}
}

// assertVolume: the pod has our emptyDir and our hostPath on hostDir, once each, and every patched
// container a check container of its image writing the subdirectory it mounts.
func assertVolume(t *testing.T, pod *corev1.Pod, hostDir string) {
	t.Helper()
	empty, host := 0, 0
	for _, v := range pod.Spec.Volumes {
		switch v.Name {
		case VolumeName:
			empty++
			if v.EmptyDir == nil {
				t.Errorf("volume %+v, want an emptyDir", v)
			}
		case HostVolumeName:
			host++
			if v.HostPath == nil || v.HostPath.Path != hostDir || v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectory {
				t.Errorf("volume %+v, want hostPath %s type Directory", v, hostDir)
			}
		}
	}
	if empty != 1 || host != 1 {
		t.Errorf("%d volumes %s and %d %s, want 1 each", empty, VolumeName, host, HostVolumeName)
	}
	for _, c := range pod.Spec.Containers {
		for _, m := range c.VolumeMounts {
			if m.Name == VolumeName {
				assertCheck(t, pod, c.Image, m.SubPath)
			}
		}
	}
}

// assertCheck: exactly one check container runs image and fills dir.
func assertCheck(t *testing.T, pod *corev1.Pod, image, dir string) {
	t.Helper()
	n := 0
	for _, c := range pod.Spec.InitContainers {
		if !strings.HasPrefix(c.Name, CheckContainerPrefix) || c.Image != image {
			continue
		}
		n++
		if c.Name != CheckContainerPrefix+dir || dir == "" {
			t.Errorf("check container %s for the subdirectory %q", c.Name, dir)
		}
		want := []corev1.VolumeMount{
			{Name: HostVolumeName, MountPath: HostMountPath, ReadOnly: true},
			{Name: VolumeName, MountPath: MountPath, SubPath: dir},
		}
		if !reflect.DeepEqual(c.VolumeMounts, want) {
			t.Errorf("check container %s mounts %+v, want %+v", c.Name, c.VolumeMounts, want)
		}
		if len(c.Command) < 5 || c.Command[0] != HostMountPath+"/"+CheckerName {
			t.Errorf("check container %s runs %v", c.Name, c.Command)
		}
	}
	if n != 1 {
		t.Errorf("%d check containers for image %s, want 1", n, image)
	}
}

func TestMutateTwoContainers(t *testing.T) {
	pod := testPod(map[string]string{AnnotationIntercept: "true"}, ctr("a"), ctr("b"))
	pod.Spec.InitContainers = []corev1.Container{ctr("init")}
	changed, warnings := Mutator{}.Mutate(pod)
	if !changed || len(warnings) != 0 {
		t.Fatalf("changed %v warnings %v", changed, warnings)
	}
	assertVolume(t, pod, DefaultHostDir)
	assertPatched(t, pod.Spec.Containers[0], "/opt/peregrine/il/libperegrine_il.so")
	assertPatched(t, pod.Spec.Containers[1], "/opt/peregrine/il/libperegrine_il.so")
	assertUntouched(t, pod.Spec.InitContainers[0])
	if _, n := envValue(pod.Spec.Containers[0], "PEREGRINE_IL_REPORT"); n != 0 {
		t.Errorf("PEREGRINE_IL_REPORT set without the report annotation")
	}

	// Idempotent: a second pass (reinvocation) changes nothing.
	again := pod.DeepCopy()
	if changed, _ := (Mutator{}).Mutate(again); changed {
		t.Errorf("second Mutate changed the pod")
	}
}

func TestMutateNotAsked(t *testing.T) {
	for _, ann := range []map[string]string{nil, {AnnotationIntercept: "false"}, {AnnotationIntercept: "True"}, {AnnotationIntercept: ""}, {"other": "true"}} {
		pod := testPod(ann, ctr("a"))
		before := pod.DeepCopy()
		if changed, _ := (Mutator{}).Mutate(pod); changed || len(pod.Spec.Volumes) != 0 {
			t.Errorf("annotations %v: pod changed", ann)
		}
		assertUntouched(t, pod.Spec.Containers[0])
		if pod.Spec.Containers[0].Env != nil || before.Spec.Containers[0].Env != nil {
			t.Errorf("annotations %v: env touched", ann)
		}
	}
}

func TestMutateExclude(t *testing.T) {
	pod := testPod(map[string]string{AnnotationIntercept: "true", AnnotationInterceptExclude: " b , nosuch,"}, ctr("a"), ctr("b"), ctr("c"))
	if changed, _ := (Mutator{HostDir: "/srv/il"}).Mutate(pod); !changed {
		t.Fatal("not changed")
	}
	assertVolume(t, pod, "/srv/il")
	assertPatched(t, pod.Spec.Containers[0], LibraryPath)
	assertUntouched(t, pod.Spec.Containers[1])
	assertPatched(t, pod.Spec.Containers[2], LibraryPath)

	// Every container excluded: no volume either.
	pod = testPod(map[string]string{AnnotationIntercept: "true", AnnotationInterceptExclude: "a"}, ctr("a"))
	if changed, _ := (Mutator{}).Mutate(pod); changed || len(pod.Spec.Volumes) != 0 {
		t.Errorf("all excluded: changed")
	}
}

func TestMutateExistingPreload(t *testing.T) {
	pod := testPod(map[string]string{AnnotationIntercept: "true", AnnotationInterceptReport: "true"},
		ctr("a", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libfoo.so"}),
		ctr("b", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libfoo.so " + LibraryPath}),
		ctr("c", corev1.EnvVar{Name: "LD_PRELOAD", Value: "/usr/lib/libfoo.so:"}, corev1.EnvVar{Name: "PEREGRINE_IL_REPORT", Value: "0"}),
		ctr("d", corev1.EnvVar{Name: "LD_PRELOAD", Value: ""}),
	)
	if changed, _ := (Mutator{}).Mutate(pod); !changed {
		t.Fatal("not changed")
	}
	assertPatched(t, pod.Spec.Containers[0], "/usr/lib/libfoo.so:"+LibraryPath)
	assertPatched(t, pod.Spec.Containers[1], "/usr/lib/libfoo.so "+LibraryPath) // already there
	assertPatched(t, pod.Spec.Containers[2], "/usr/lib/libfoo.so:"+LibraryPath)
	assertPatched(t, pod.Spec.Containers[3], LibraryPath)
	for i, want := range []string{"1", "1", "0", "1"} {
		if v, n := envValue(pod.Spec.Containers[i], "PEREGRINE_IL_REPORT"); n != 1 || v != want {
			t.Errorf("container %d: PEREGRINE_IL_REPORT %q (%d), want %q", i, v, n, want)
		}
	}
}

func TestMutateConflicts(t *testing.T) {
	// LD_PRELOAD from a ConfigMap, and another volume at our mount path: those containers are left
	// alone with a warning; the others are patched.
	from := corev1.EnvVar{Name: "LD_PRELOAD", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{Key: "k"}}}
	other := ctr("mounted")
	other.VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: MountPath + "/"}}
	pod := testPod(map[string]string{AnnotationIntercept: "true"}, ctr("from", from), other, ctr("ok"))
	changed, warnings := Mutator{}.Mutate(pod)
	if !changed || len(warnings) != 2 {
		t.Fatalf("changed %v warnings %v", changed, warnings)
	}
	if pod.Spec.Containers[0].Env[0].ValueFrom == nil || len(pod.Spec.Containers[0].VolumeMounts) != 0 {
		t.Errorf("valueFrom container touched: %+v", pod.Spec.Containers[0])
	}
	if len(pod.Spec.Containers[1].VolumeMounts) != 1 || len(pod.Spec.Containers[1].Env) != 0 {
		t.Errorf("mounted container touched: %+v", pod.Spec.Containers[1])
	}
	assertPatched(t, pod.Spec.Containers[2], LibraryPath)

	// A volume of the pod's own under one of our names: nothing is patched.
	for _, v := range []corev1.Volume{
		{Name: VolumeName, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{}}},
		{Name: HostVolumeName, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/elsewhere"}}},
	} {
		pod = testPod(map[string]string{AnnotationIntercept: "true"}, ctr("a"))
		pod.Spec.Volumes = []corev1.Volume{v}
		if changed, warnings := (Mutator{}).Mutate(pod); changed || len(warnings) != 1 {
			t.Errorf("own volume %s: changed %v warnings %v", v.Name, changed, warnings)
		}
	}
}

// Each image gets one check container: the containers of the same image share its directory,
// another image gets its own. The check runs as its container does (security context, pull
// policy, CPU and memory) and never gets its extended resources.
func TestMutateCheckContainers(t *testing.T) {
	a, b, c := ctr("a"), ctr("b"), ctr("c")
	b.Image = "python:3.12"
	b.Command = []string{"/usr/local/bin/python3", "train.py"}
	b.ImagePullPolicy = corev1.PullAlways
	b.SecurityContext = &corev1.SecurityContext{RunAsUser: ptrTo(int64(1000)), ReadOnlyRootFilesystem: ptrTo(true)}
	b.Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), "nvidia.com/gpu": resource.MustParse("1")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi"), "nvidia.com/gpu": resource.MustParse("1")},
	}
	pod := testPod(map[string]string{AnnotationIntercept: "true"}, a, b, c)
	// A check container name already taken by the pod itself is skipped.
	pod.Spec.InitContainers = []corev1.Container{{Name: CheckContainerPrefix + "0", Image: "other"}}
	if changed, _ := (Mutator{}).Mutate(pod); !changed {
		t.Fatal("not changed")
	}
	checks := pod.Spec.InitContainers[1:]
	if len(checks) != 2 || checks[0].Name != CheckContainerPrefix+"1" || checks[1].Name != CheckContainerPrefix+"2" {
		t.Fatalf("check containers %+v", checks)
	}
	if sub := pod.Spec.Containers[0].VolumeMounts[0].SubPath; sub != "1" || pod.Spec.Containers[2].VolumeMounts[0].SubPath != sub {
		t.Errorf("containers of one image mount %q and %q", sub, pod.Spec.Containers[2].VolumeMounts[0].SubPath)
	}
	py := checks[1]
	if py.Image != b.Image || py.ImagePullPolicy != corev1.PullAlways || !reflect.DeepEqual(py.SecurityContext, b.SecurityContext) {
		t.Errorf("python check container %+v", py)
	}
	if got := py.Command[len(py.Command)-2:]; !reflect.DeepEqual(got, []string{"--program", "/usr/local/bin/python3"}) {
		t.Errorf("python check probes %v first", got)
	}
	wantRes := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
		Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("4Gi")},
	}
	if !reflect.DeepEqual(py.Resources, wantRes) {
		t.Errorf("python check resources %+v, want %+v", py.Resources, wantRes)
	}
	if checks[0].Resources.Requests != nil || checks[0].Resources.Limits != nil {
		t.Errorf("busybox check resources %+v, want none", checks[0].Resources)
	}
	assertVolume(t, pod, DefaultHostDir)

	// Reinvoked after another webhook added a container of a new image and changed one image:
	// one more check container, the changed container mounts the new image's directory.
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "sidecar", Image: "envoy"})
	pod.Spec.Containers[2].Image = "envoy"
	if changed, _ := (Mutator{}).Mutate(pod); !changed {
		t.Fatal("reinvocation: not changed")
	}
	if n := len(pod.Spec.InitContainers); n != 4 {
		t.Fatalf("%d init containers after reinvocation, want 4", n)
	}
	assertVolume(t, pod, DefaultHostDir)
	assertPatched(t, pod.Spec.Containers[3], LibraryPath)
	if again := pod.DeepCopy(); func() bool { ch, _ := (Mutator{}).Mutate(again); return ch }() {
		t.Errorf("third Mutate changed the pod")
	}
}

func ptrTo[T any](v T) *T { return &v }

func TestAppendPreload(t *testing.T) {
	for in, want := range map[string]string{
		"":                             LibraryPath,
		"/a.so":                        "/a.so:" + LibraryPath,
		"/a.so /b.so":                  "/a.so /b.so:" + LibraryPath,
		LibraryPath:                    LibraryPath,
		"/a.so:" + LibraryPath + ":/b": "/a.so:" + LibraryPath + ":/b",
		"/a.so::":                      "/a.so:" + LibraryPath,
	} {
		if got, _ := appendPreload(in); got != want {
			t.Errorf("appendPreload(%q) = %q, want %q", in, got, want)
		}
	}
}

// The handler: a JSON patch for an annotated pod that, applied, gives what Mutate gives; no patch
// for a plain pod.
func TestHandler(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	h := NewPodInterceptor(scheme, "")
	request := func(pod *corev1.Pod) admission.Request {
		raw, err := json.Marshal(pod)
		if err != nil {
			t.Fatal(err)
		}
		return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
			UID: "u", Operation: admissionv1.Create, Namespace: "ns",
			Kind:   metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Object: runtime.RawExtension{Raw: raw},
		}}
	}

	resp := h.Handle(context.Background(), request(testPod(nil, ctr("a"))))
	if !resp.Allowed || len(resp.Patches) != 0 || resp.PatchType != nil {
		t.Errorf("plain pod: %+v", resp)
	}

	pod := testPod(map[string]string{AnnotationIntercept: "true"}, ctr("a"), ctr("b"))
	resp = h.Handle(context.Background(), request(pod))
	if !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("annotated pod: %+v", resp)
	}
	ops := map[string]int{}
	for _, p := range resp.Patches {
		ops[p.Operation+" "+p.Path]++
	}
	for _, want := range []string{"add /spec/volumes", "add /spec/initContainers", "add /spec/containers/0/env", "add /spec/containers/1/volumeMounts"} {
		if ops[want] != 1 {
			t.Errorf("patch lacks %q: %v", want, resp.Patches)
		}
	}
	for op := range ops {
		if op[:3] != "add" {
			t.Errorf("unexpected op %q in %v", op, resp.Patches)
		}
	}

	// An already patched pod: allowed, no patch.
	Mutator{}.Mutate(pod)
	if resp := h.Handle(context.Background(), request(pod)); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("patched pod: %+v", resp)
	}
}
