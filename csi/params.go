package csi

import (
	"fmt"
	"math/bits"
	"sort"
	"strconv"
	"strings"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// StorageClass parameters (and, for inline ephemeral volumes, volume attributes) that shape the
// container behind a volume. Keys under "csi.storage.k8s.io/" belong to the sidecars and are
// ignored; mount options (threads, attrTimeout, ...) are the node's and pass through.
const (
	ParamPool      = "pool"
	ParamOclass    = "oclass"
	ParamDirOclass = "dirOclass"
	ParamChunkSize = "chunkSize"
	ParamRF        = "rf"
	ParamChecksum  = "checksum"
	ParamSync      = "sync"
)

// sidecarPrefix marks parameters the external-provisioner adds or consumes.
const sidecarPrefix = "csi.storage.k8s.io/"

// ObjectClasses are the object classes a StorageClass may name.
var ObjectClasses = []string{"S1", "S2", "S4", "SX", "RP_2G1", "RP_3G1", "RP_2GX", "EC_2P1G1", "EC_4P2G1", "EC_2P1GX"}

// mountParams are volume attributes the node service reads; the controller accepts and keeps them.
var mountParams = []string{"threads", "attrTimeout", "dentryTimeout", "dataCache", "readOnly", "ioUring"}

// VolumeParams are a StorageClass's parameters, checked.
type VolumeParams struct {
	Pool      string
	Oclass    string
	DirOclass string
	ChunkSize uint64
	RF        uint32
	Checksum  string
	Sync      string
	// Mount holds the node's mount options, passed on in the volume context.
	Mount map[string]string
}

// ParseParams checks StorageClass parameters; an error names the parameter and what it allows.
// The pool is required unless defaultPool is set.
func ParseParams(p map[string]string, defaultPool string) (*VolumeParams, error) {
	v := &VolumeParams{Pool: defaultPool, Mount: map[string]string{}}
	for _, k := range sortedKeys(p) {
		val := p[k]
		switch {
		case strings.HasPrefix(k, sidecarPrefix):
		case k == ParamPool:
			if val == "" {
				return nil, fmt.Errorf("parameter %s: empty (want the label or UUID of a pool)", k)
			}
			v.Pool = val
		case k == ParamOclass, k == ParamDirOclass:
			c, err := parseOclass(k, val)
			if err != nil {
				return nil, err
			}
			if k == ParamOclass {
				v.Oclass = c
			} else {
				v.DirOclass = c
			}
		case k == ParamChunkSize:
			n, err := storagev1.Size(val).Bytes()
			if err != nil || n < 4096 || n > 64<<20 || bits.OnesCount64(n) != 1 {
				return nil, fmt.Errorf("parameter %s=%q: want a power of two from 4KiB to 64MiB (e.g. 1MiB)", k, val)
			}
			v.ChunkSize = n
		case k == ParamRF:
			n, err := strconv.ParseUint(val, 10, 32)
			if err != nil || n > 4 {
				return nil, fmt.Errorf("parameter %s=%q: want 0, 1, 2, 3 or 4 (engine failures the container must survive)", k, val)
			}
			v.RF = uint32(n)
		case k == ParamChecksum:
			c := strings.ToLower(val)
			if c != "crc32c" && c != "off" {
				return nil, fmt.Errorf("parameter %s=%q: want crc32c or off", k, val)
			}
			v.Checksum = c
		case k == ParamSync:
			s := strings.ToLower(val)
			if s != "standard" && s != "always" {
				return nil, fmt.Errorf("parameter %s=%q: want standard or always", k, val)
			}
			v.Sync = s
		case contains(mountParams, k):
			v.Mount[k] = val
		default:
			return nil, fmt.Errorf("parameter %q: unknown (known: %s, %s, %s, %s, %s, %s, %s, and the mount options %s)",
				k, ParamPool, ParamOclass, ParamDirOclass, ParamChunkSize, ParamRF, ParamChecksum, ParamSync, strings.Join(mountParams, ", "))
		}
	}
	if v.Pool == "" {
		return nil, fmt.Errorf("parameter %s: missing (want the label or UUID of a pool)", ParamPool)
	}
	return v, nil
}

func parseOclass(k, val string) (string, error) {
	c := strings.ToUpper(val)
	if !contains(ObjectClasses, c) {
		return "", fmt.Errorf("parameter %s=%q: unknown object class (want one of %s)", k, val, strings.Join(ObjectClasses, ", "))
	}
	return c, nil
}

// ContCreateReq is the container creation request for these parameters.
func (v *VolumeParams) ContCreateReq(label string, quota uint64) *mgmtpb.ContCreateReq {
	props := map[string]string{}
	if v.Sync != "" {
		props["sync"] = v.Sync
	}
	if quota > 0 {
		props["quota"] = strconv.FormatUint(quota, 10)
	}
	return &mgmtpb.ContCreateReq{
		Pool:             v.Pool,
		Label:            label,
		Oclass:           v.Oclass,
		DirOclass:        v.DirOclass,
		ChunkSize:        v.ChunkSize,
		RedundancyFactor: v.RF,
		Checksum:         v.Checksum,
		Props:            props,
	}
}

// Matches reports how an existing container differs from these parameters ("" when it does
// not): CreateVolume of an existing name must not hand out a different volume.
func (v *VolumeParams) Matches(c *mgmtpb.ContInfo) string {
	var diff []string
	check := func(name, want, got string) {
		if want != "" && !strings.EqualFold(want, got) {
			diff = append(diff, fmt.Sprintf("%s %s (asked %s)", name, got, want))
		}
	}
	check(ParamOclass, v.Oclass, c.Oclass)
	check(ParamDirOclass, v.DirOclass, c.DirOclass)
	check(ParamChecksum, v.Checksum, c.Checksum.Word())
	check(ParamSync, v.Sync, c.Props["sync"])
	if v.ChunkSize != 0 && v.ChunkSize != c.ChunkSize {
		diff = append(diff, fmt.Sprintf("%s %d (asked %d)", ParamChunkSize, c.ChunkSize, v.ChunkSize))
	}
	if v.RF != c.RedundancyFactor {
		diff = append(diff, fmt.Sprintf("%s %d (asked %d)", ParamRF, c.RedundancyFactor, v.RF))
	}
	return strings.Join(diff, ", ")
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
