package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"strings"

	corev1 "k8s.io/api/core/v1"
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

	// VolumeName is the hostPath volume holding the library.
	VolumeName = "peregrine-il"
	// MountPath is where the library directory appears in each patched container.
	MountPath = "/opt/peregrine/il"
	// LibraryName is the interception library's file name in that directory.
	LibraryName = "libperegrine_il.so"
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
// The image must have a C library that binds the library (see "Images without a compatible libc"
// in the package documentation): otherwise the container does not start.
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

	// The volume: ours if present with our hostPath; someone else's volume under our name is left
	// alone and nothing is patched (mounting it at MountPath would preload an unrelated file).
	volumeIdx := -1
	for i := range pod.Spec.Volumes {
		if pod.Spec.Volumes[i].Name == VolumeName {
			volumeIdx = i
			break
		}
	}
	if volumeIdx >= 0 {
		hp := pod.Spec.Volumes[volumeIdx].HostPath
		if hp == nil || path.Clean(hp.Path) != path.Clean(m.hostDir()) {
			return false, []string{fmt.Sprintf("peregrine: pod has its own volume %q; interception not added", VolumeName)}
		}
	}

	patchedAny := false
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		if excluded[c.Name] {
			continue
		}
		ok, w := patchContainer(c, report)
		warnings = append(warnings, w...)
		if ok.patched {
			patchedAny = true
		}
		if ok.changed {
			changed = true
		}
	}
	if patchedAny && volumeIdx < 0 {
		dir := corev1.HostPathDirectory
		pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{
			Name: VolumeName,
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{
				Path: m.hostDir(),
				Type: &dir,
			}},
		})
		changed = true
	}
	return changed, warnings
}

type containerResult struct {
	patched bool // the container uses the volume (now or already)
	changed bool // this call changed the container
}

func patchContainer(c *corev1.Container, report bool) (r containerResult, warnings []string) {
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
	if mountIdx < 0 {
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: VolumeName, MountPath: MountPath, ReadOnly: true})
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
