package csi

import (
	"context"
	"fmt"
	"strings"
)

// DriverName is the CSI driver's name, as StorageClasses, CSIDriver objects and PVs spell it.
const DriverName = "csi.peregrine.dev"

// A volume is one POSIX container. Its ID names the pool and the container, "POOL/CONT", with
// the UUIDs for volumes the controller created and any labels or UUIDs for static PVs.
type VolumeID struct {
	Pool string
	Cont string
}

func (v VolumeID) String() string { return v.Pool + "/" + v.Cont }

// ParseVolumeID parses "POOL/CONT".
func ParseVolumeID(id string) (VolumeID, error) {
	pool, cont, ok := strings.Cut(id, "/")
	if !ok || pool == "" || cont == "" || strings.Contains(cont, "/") {
		return VolumeID{}, fmt.Errorf("volume ID %q: want POOL/CONT (pool and container, each a label or a UUID)", id)
	}
	return VolumeID{Pool: pool, Cont: cont}, nil
}

// EphemeralProvisioner makes and removes the container behind a CSI inline ephemeral volume
// (the node publishes it without a controller call). The controller side implements it.
type EphemeralProvisioner interface {
	// CreateEphemeral creates (or finds, by name) a container for the inline volume `name` from
	// the pod's volume attributes, which are StorageClass-style parameters, and returns its ID.
	CreateEphemeral(ctx context.Context, name string, attributes map[string]string) (VolumeID, error)
	// DeleteEphemeral destroys it (idempotent).
	DeleteEphemeral(ctx context.Context, id VolumeID) error
}
