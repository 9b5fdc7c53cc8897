package controllers

import (
	"fmt"
	"path"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// EnginePolicy is what the operator's own configuration (its flags, set by whoever installs it)
// lets a ServerSet author run: engine images and the node paths the engine pods mount. A
// ServerSet outside it is not rendered; its Ready condition is False with reason NotAllowed and
// a message naming the field. The chart's ValidatingAdmissionPolicy refuses the same ServerSets
// at admission with the same lists (charts/peregrine/templates/admission-policy.yaml).
//
// The matching is on plain strings, the same in Go and in the admission policy's CEL:
//   - an image is allowed when it starts with one of AllowedImages; each entry ends with "/" (a
//     registry or a repository path: everything below it), ":" (one repository, any tag) or "@"
//     (one repository, by digest), so that "registry.example.com" can never also allow
//     "registry.example.com.evil.org/...";
//   - an emulated storage hostPath is allowed when it is one of AllowedHostPaths or a directory
//     below one;
//   - an NVMe device path is allowed when it starts with one of AllowedDevices ("/dev/nvme"
//     allows /dev/nvme0n1 and /dev/nvme1n1p2).
//
// Paths with "." or ".." components, or with empty ones ("//"), are refused whatever the lists say.
type EnginePolicy struct {
	AllowedImages    []string
	AllowedHostPaths []string
	AllowedDevices   []string
	// AllowInsecureControlPlane lets a ServerSet ask for spec.insecureControlPlane (engines
	// serving gRPC without TLS); --allow-insecure-control-plane.
	AllowInsecureControlPlane bool
}

// Defaults of the operator's flags, the chart's values and config/manager: the engine image
// `make images` builds, the directory the samples and the demo put emulated NVMe files in, and
// NVMe namespaces by kernel name, by id and by PCI path (the chart's GKE and on-prem profiles).
var (
	DefaultAllowedImages    = []string{"peregrine/engine:", "peregrine/engine@"}
	DefaultAllowedHostPaths = []string{"/var/lib/peregrine"}
	DefaultAllowedDevices   = []string{"/dev/nvme", "/dev/disk/by-id/nvme-", "/dev/disk/by-id/google-local-nvme-ssd-", "/dev/disk/by-path/pci-"}
)

// DefaultEnginePolicy is the policy of an operator started without the flags.
func DefaultEnginePolicy() EnginePolicy {
	return EnginePolicy{
		AllowedImages:    append([]string(nil), DefaultAllowedImages...),
		AllowedHostPaths: append([]string(nil), DefaultAllowedHostPaths...),
		AllowedDevices:   append([]string(nil), DefaultAllowedDevices...),
	}
}

// Validate checks the policy's own entries (the operator refuses to start with a bad one).
func (p EnginePolicy) Validate() error {
	for _, i := range p.AllowedImages {
		if i == "" || !strings.ContainsAny(i[len(i)-1:], "/:@") {
			return fmt.Errorf("allowed image prefix %q must end with '/' (a registry or path), ':' (a repository, any tag) or '@' (a repository, by digest)", i)
		}
	}
	for _, h := range p.AllowedHostPaths {
		if !cleanAbsolute(h) || h == "/" {
			return fmt.Errorf("allowed host path %q must be an absolute, clean directory path other than /", h)
		}
	}
	for _, d := range p.AllowedDevices {
		if !strings.HasPrefix(d, "/dev/") || strings.Contains(d, "/..") || strings.Contains(d, "/./") || strings.Contains(d, "//") {
			return fmt.Errorf("allowed device prefix %q must start with /dev/ and have no '.', '..' or empty components", d)
		}
	}
	return nil
}

// cleanAbsolute reports whether p is absolute with no ".", ".." or empty component and no
// trailing slash (what path.Clean leaves unchanged).
func cleanAbsolute(p string) bool {
	return strings.HasPrefix(p, "/") && path.Clean(p) == p
}

// Check returns what of ss the policy refuses, each naming its field; nil when ss is allowed.
func (p EnginePolicy) Check(ss *storagev1.ServerSet) field.ErrorList {
	var errs field.ErrorList
	spec := field.NewPath("spec")
	if !hasPrefix(ss.Spec.Image, p.AllowedImages) {
		errs = append(errs, field.Forbidden(spec.Child("image"), fmt.Sprintf(
			"image %q is not allowed by the operator's --allowed-images (%s)", ss.Spec.Image, list(p.AllowedImages))))
	}
	st := spec.Child("storage")
	if e := ss.Spec.Storage.Emulated; e != nil {
		f := st.Child("emulated", "hostPath")
		switch {
		case !cleanAbsolute(e.HostPath):
			errs = append(errs, field.Invalid(f, e.HostPath, "must be an absolute path without '.', '..' or empty components, and no trailing '/'"))
		case !underAny(e.HostPath, p.AllowedHostPaths):
			errs = append(errs, field.Forbidden(f, fmt.Sprintf(
				"host path %q is not one of, or below, the operator's --allowed-host-paths (%s)", e.HostPath, list(p.AllowedHostPaths))))
		}
	}
	if ss.Spec.InsecureControlPlane && !p.AllowInsecureControlPlane {
		errs = append(errs, field.Forbidden(spec.Child("insecureControlPlane"),
			"engines without TLS on their control plane are not allowed by the operator (--allow-insecure-control-plane is off)"))
	}
	if n := ss.Spec.Storage.Nvme; n != nil {
		f := st.Child("nvme", "device")
		switch {
		case !cleanAbsolute(n.Device):
			errs = append(errs, field.Invalid(f, n.Device, "must be an absolute path without '.', '..' or empty components"))
		case !hasPrefix(n.Device, p.AllowedDevices):
			errs = append(errs, field.Forbidden(f, fmt.Sprintf(
				"device %q does not start with one of the operator's --allowed-devices (%s)", n.Device, list(p.AllowedDevices))))
		}
	}
	return errs
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

func underAny(p string, dirs []string) bool {
	for _, d := range dirs {
		if p == d || strings.HasPrefix(p, d+"/") {
			return true
		}
	}
	return false
}

func list(l []string) string {
	if len(l) == 0 {
		return "none"
	}
	return strings.Join(l, ", ")
}

// policyMessage joins the refusals into one condition message.
func policyMessage(errs field.ErrorList) string {
	msgs := make([]string, 0, len(errs))
	for _, e := range errs {
		msgs = append(msgs, e.Error())
	}
	return strings.Join(msgs, "; ")
}

// needsPrivileged reports whether the engine pod must run privileged: only to open a kernel block
// device (NVMe) passed in as a hostPath, which the device cgroup of an unprivileged container
// refuses. Emulated NVMe (a file on a host directory) needs no privilege.
func needsPrivileged(ss *storagev1.ServerSet) bool {
	return ss.Spec.Storage.Nvme != nil
}
