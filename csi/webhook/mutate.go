package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	// AnnotationIntercept asks for the interception library when it is exactly "true".
	AnnotationIntercept = "peregrine.dev/intercept"
	// AnnotationInterceptExclude is a comma list of container names to leave alone.
	AnnotationInterceptExclude = "peregrine.dev/intercept-exclude"
	// AnnotationInterceptReport "true" also sets PEREGRINE_IL_REPORT=1 (a summary at exit).
	AnnotationInterceptReport = "peregrine.dev/intercept-report"

	// MutatePath is where the webhook server serves the pod mutation.
	MutatePath = "/mutate-v1-pod"

	// VolumeName is the pod's emptyDir that holds, per image, the library when that image's C
	// library binds it (one subdirectory per image, filled by its check container).
	VolumeName = "peregrine-il"
	// HostVolumeName is the hostPath volume on the node plugin's directory: the library, ISA-L
	// and the checker, seen only by the check containers.
	HostVolumeName = "peregrine-il-host"
	// MountPath is where a patched container sees its image's subdirectory of VolumeName.
	MountPath = "/opt/peregrine/il"
	// HostMountPath is where a check container sees the node plugin's directory.
	HostMountPath = "/opt/peregrine/il-host"
	// LibraryName is the interception library's file name in those directories.
	LibraryName = "libperegrine_il.so"
	// CheckerName is the static checker's file name in the node plugin's directory.
	CheckerName = "peregrine-il-check"
	// CheckContainerPrefix names the check containers: the prefix and the image's subdirectory.
	CheckContainerPrefix = "peregrine-il-check-"
	// DefaultHostDir is the CSI node plugin's directory with the library on each node.
	DefaultHostDir = "/var/lib/peregrine/il"

	envPreload = "LD_PRELOAD"
	envReport  = "PEREGRINE_IL_REPORT"
)

// LibraryPath is the library's path inside a patched container.
var LibraryPath = path.Join(MountPath, LibraryName)

// Mutator patches pod specs. HostDir is the node directory behind the hostPath volume
// (DefaultHostDir when empty).
type Mutator struct {
	HostDir string
}

func (m Mutator) hostDir() string {
	if m.HostDir == "" {
		return DefaultHostDir
	}
	return m.HostDir
}

// Mutate applies the interception patch to pod in place. It reports whether anything changed and
// the warnings to hand back to the client (containers or volumes it had to leave alone). A pod that
// does not ask for interception, and a pod already patched, come back unchanged.
//
// Each image of a patched container gets a check container (an init container running that
// image) that hands the library over only when the image's C library binds it (see "Images
// without a compatible libc" in the package documentation), so an image without one still starts.
func (m Mutator) Mutate(pod *corev1.Pod) (changed bool, warnings []string) {
	if pod.Annotations[AnnotationIntercept] != "true" {
		return false, nil
	}
	excluded := map[string]bool{}
	for _, name := range strings.Split(pod.Annotations[AnnotationInterceptExclude], ",") {
		if name = strings.TrimSpace(name); name != "" {
			excluded[name] = true
		}
	}
	report := pod.Annotations[AnnotationInterceptReport] == "true"

	// The volumes: ours if present in our shape; someone else's volume under one of our names is
	// left alone and nothing is patched (mounting it would preload an unrelated file).
	emptyIdx, hostIdx := volumeIndex(pod, VolumeName), volumeIndex(pod, HostVolumeName)
	if emptyIdx >= 0 && pod.Spec.Volumes[emptyIdx].EmptyDir == nil {
		return false, []string{fmt.Sprintf("peregrine: pod has its own volume %q; interception not added", VolumeName)}
	}
	if hostIdx >= 0 {
		hp := pod.Spec.Volumes[hostIdx].HostPath
		if hp == nil || path.Clean(hp.Path) != path.Clean(m.hostDir()) {
			return false, []string{fmt.Sprintf("peregrine: pod has its own volume %q; interception not added", HostVolumeName)}
		}
	}

	checks := existingChecks(pod)
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if excluded[c.Name] {
			continue
		}
		dir, checked := checks[c.Image]
		if !checked {
			dir = nextCheckDir(pod)
		}
		r, w := patchContainer(c, dir, report)
		warnings = append(warnings, w...)
		if !r.patched {
			continue
		}
		changed = changed || r.changed
		if !checked {
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, checkContainer(c, dir))
			checks[c.Image] = dir
			changed = true
		}
	}
	if !changed {
		return false, warnings
	}
	if emptyIdx < 0 {
		// Room for the library and ISA-L, per image.
		limit := resource.MustParse("64Mi")
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: VolumeName,
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: &limit}}})
	}
	if hostIdx < 0 {
		dir := corev1.HostPathDirectory
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: HostVolumeName,
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: m.hostDir(), Type: &dir}}})
	}
	return true, warnings
}

func volumeIndex(pod *corev1.Pod, name string) int {
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == name {
			return i
		}
	}
	return -1
}

// existingChecks maps each image that already has a check container (a reinvoked webhook, or a
// pod patched before) to its subdirectory.
func existingChecks(pod *corev1.Pod) map[string]string {
	checks := map[string]string{}
	for _, c := range pod.Spec.InitContainers {
		if dir, ok := strings.CutPrefix(c.Name, CheckContainerPrefix); ok {
			checks[c.Image] = dir
		}
	}
	return checks
}

// nextCheckDir is the first subdirectory number no check container uses yet.
func nextCheckDir(pod *corev1.Pod) string {
	used := map[string]bool{}
	for _, c := range pod.Spec.InitContainers {
		used[c.Name] = true
	}
	for n := 0; ; n++ {
		if dir := strconv.Itoa(n); !used[CheckContainerPrefix+dir] {
			return dir
		}
	}
}

// checkContainer runs the checker in c's image: the image's own loader tries the library and,
// only when it binds, the checker copies it into the image's subdirectory of the emptyDir. It
// always succeeds (exit 0), so interception stays an optimisation and never a reason a pod does
// not start. It runs as c does (its security context, user and pull policy) and asks for no more
// CPU and memory than c, so it passes the admission checks c passes and adds nothing to the
// pod's requests (the larger of init and regular containers counts); extended resources (GPUs)
// are not copied, so that no device is handed to it.
func checkContainer(c *corev1.Container, dir string) corev1.Container {
	check := corev1.Container{
		Name:            CheckContainerPrefix + dir,
		Image:           c.Image,
		ImagePullPolicy: c.ImagePullPolicy,
		Command: []string{path.Join(HostMountPath, CheckerName),
			"--from", HostMountPath, "--to", MountPath},
		VolumeMounts: []corev1.VolumeMount{
			{Name: HostVolumeName, MountPath: HostMountPath, ReadOnly: true},
			{Name: VolumeName, MountPath: MountPath, SubPath: dir},
		},
		SecurityContext:          c.SecurityContext.DeepCopy(),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
	}
	// The container's own program first: it is the one whose loader must bind the library.
	if len(c.Command) > 0 && path.IsAbs(c.Command[0]) {
		check.Command = append(check.Command, "--program", c.Command[0])
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[name]; ok {
			if check.Resources.Requests == nil {
				check.Resources.Requests = corev1.ResourceList{}
			}
			check.Resources.Requests[name] = q
		}
		if q, ok := c.Resources.Limits[name]; ok {
			if check.Resources.Limits == nil {
				check.Resources.Limits = corev1.ResourceList{}
			}
			check.Resources.Limits[name] = q
		}
	}
	return check
}

type containerResult struct {
	patched bool // the container uses the volume (now or already)
	changed bool // this call changed the container
}

func patchContainer(c *corev1.Container, dir string, report bool) (r containerResult, warnings []string) {
	// The LD_PRELOAD entry that takes effect is the last one (later env entries win).
	preloadIdx := -1
	for i := range c.Env {
		if c.Env[i].Name == envPreload {
			preloadIdx = i
		}
	}
	if preloadIdx >= 0 && c.Env[preloadIdx].ValueFrom != nil {
		return r, []string{fmt.Sprintf("peregrine: container %q takes LD_PRELOAD from valueFrom; interception not added", c.Name)}
	}
	mountIdx := -1
	for i := range c.VolumeMounts {
		if path.Clean(c.VolumeMounts[i].MountPath) == MountPath {
			mountIdx = i
			break
		}
	}
	if mountIdx >= 0 && c.VolumeMounts[mountIdx].Name != VolumeName {
		return r, []string{fmt.Sprintf("peregrine: container %q already mounts %s; interception not added", c.Name, MountPath)}
	}

	r.patched = true
	want := corev1.VolumeMount{Name: VolumeName, MountPath: MountPath, SubPath: dir, ReadOnly: true}
	if mountIdx < 0 {
		c.VolumeMounts = append(c.VolumeMounts, want)
		r.changed = true
	} else if c.VolumeMounts[mountIdx] != want {
		// The image changed since it was patched (a later webhook): its own check's directory.
		c.VolumeMounts[mountIdx] = want
		r.changed = true
	}
	if preloadIdx < 0 {
		c.Env = append(c.Env, corev1.EnvVar{Name: envPreload, Value: LibraryPath})
		r.changed = true
	} else if v, ok := appendPreload(c.Env[preloadIdx].Value); ok {
		c.Env[preloadIdx].Value = v
		r.changed = true
	}
	if report {
		has := false
		for i := range c.Env {
			if c.Env[i].Name == envReport {
				has = true // the container's own setting wins
			}
		}
		if !has {
			c.Env = append(c.Env, corev1.EnvVar{Name: envReport, Value: "1"})
			r.changed = true
		}
	}
	return r, nil
}

// appendPreload adds the library to an LD_PRELOAD value, with ':' as separator, unless it is
// already in it. ld.so separates the list by colons or spaces.
func appendPreload(value string) (string, bool) {
	for _, item := range strings.FieldsFunc(value, func(r rune) bool { return r == ':' || r == ' ' }) {
		if item == LibraryPath {
			return value, false
		}
	}
	trimmed := strings.TrimRight(value, ": ")
	if trimmed == "" {
		return LibraryPath, true
	}
	return trimmed + ":" + LibraryPath, true
}

// PodInterceptor is the admission.Handler served at MutatePath.
type PodInterceptor struct {
	Mutator Mutator
	Decoder admission.Decoder
}

// NewPodInterceptor returns the handler, decoding with scheme (which must know core/v1).
func NewPodInterceptor(scheme *runtime.Scheme, hostDir string) *PodInterceptor {
	return &PodInterceptor{Mutator: Mutator{HostDir: hostDir}, Decoder: admission.NewDecoder(scheme)}
}

// Handle implements admission.Handler. It always allows the pod: a request it cannot decode is
// answered with an error, which the API server treats per the failure policy (Ignore).
func (h *PodInterceptor) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := h.Decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	changed, warnings := h.Mutator.Mutate(pod)
	if !changed {
		return admission.Allowed("").WithWarnings(warnings...)
	}
	current, err := json.Marshal(pod)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, current).WithWarnings(warnings...)
}
