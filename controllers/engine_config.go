package controllers

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// engineConfigKey is the ConfigMap key of the engine configuration every rank of a ServerSet
// shares (mounted at configMountPath).
const engineConfigKey = "engine.yaml"

// startScriptKey is the ConfigMap key of the pod's start script (startScript).
const startScriptKey = "start-engine.sh"

// engineConfig is the part of the engine's YAML configuration the operator sets, key for key as
// the engine's Config (engine/crates/engine/src/config.rs), which refuses unknown keys. It holds
// only what all ranks of a ServerSet share: each pod passes its own rank, listen address, fault
// domain, DNS name and device file as command-line flags (startScript), which the engine puts
// over these values before it validates them.
type engineConfig struct {
	Name            string     `yaml:"name"`
	ControlPort     int32      `yaml:"control_port"`
	DataPort        int32      `yaml:"data_port"`
	Targets         int32      `yaml:"targets"`
	Hugepages       bool       `yaml:"hugepages"`
	FlushIntervalMs *int64     `yaml:"flush_interval_ms,omitempty"`
	Scm             engineScm  `yaml:"scm"`
	Bdev            engineBdev `yaml:"bdev"`
	MgmtSvcReplicas []string   `yaml:"mgmt_svc_replicas"`
	LogLevel        string     `yaml:"log_level"`
	TLSDir          string     `yaml:"tls_dir,omitempty"`
	AllowInsecure   bool       `yaml:"allow_insecure,omitempty"`
}

// scmClass is the engine's `scm.class` (engine/crates/engine/src/config/mod.rs: ScmClass).
type scmClass string

// bdevClass is the engine's `bdev.class` (engine/crates/engine/src/config/mod.rs: BdevConfig).
type bdevClass string

const (
	// scmRAM keeps the SCM tier in RAM, made durable by the WAL.
	scmRAM scmClass = "ram"
	// bdevKdev is a kernel block device (NVMe, or a loop device as emulated NVMe).
	bdevKdev bdevClass = "kdev"
	// bdevFile is a file of the pod's host path, made to the configured size.
	bdevFile bdevClass = "file"
)

// engineScm is the engine's `scm` (the SCM tier: RAM).
type engineScm struct {
	Class scmClass       `yaml:"class"`
	Size  storagev1.Size `yaml:"size"`
}

// engineBdev is the engine's `bdev`: class kdev names a device; class file (emulated NVMe) a
// size, its path being each pod's (--bdev-path).
type engineBdev struct {
	Class  bdevClass      `yaml:"class"`
	Device string         `yaml:"device,omitempty"`
	Path   string         `yaml:"path,omitempty"`
	Size   storagev1.Size `yaml:"size,omitempty"`
}

// renderEngineConfig is the engine configuration of the ServerSet's ranks.
func renderEngineConfig(ss *storagev1.ServerSet) engineConfig {
	targets := ss.Spec.Targets
	if targets == 0 {
		targets = 1
	}
	replicas := ss.Spec.MgmtSvcReplicas
	if replicas == 0 {
		replicas = 1
	}
	logLevel := ss.Spec.LogLevel
	if logLevel == "" {
		logLevel = "info"
	}
	c := engineConfig{
		Name:        systemName(ss),
		ControlPort: controlPort(ss),
		DataPort:    dataPort(ss),
		Targets:     targets,
		Hugepages:   hugepages(ss).Sign() > 0,
		Scm:         engineScm{Class: scmRAM, Size: ss.Spec.Storage.Scm},
		LogLevel:    logLevel,
	}
	if fi := ss.Spec.FlushInterval; fi != nil {
		ms := fi.Milliseconds()
		c.FlushIntervalMs = &ms
	}
	switch {
	case ss.Spec.Storage.Nvme != nil:
		c.Bdev = engineBdev{Class: bdevKdev, Device: ss.Spec.Storage.Nvme.Device}
	case ss.Spec.Storage.Emulated != nil:
		c.Bdev = engineBdev{Class: bdevFile, Size: ss.Spec.Storage.Emulated.Size}
	}
	// The pods' names behind the headless Service: each engine knows its own (--dns-name), so
	// rank 0 finds itself first in the list.
	for r := int32(0); r < replicas; r++ {
		c.MgmtSvcReplicas = append(c.MgmtSvcReplicas, fmt.Sprintf("%s:%d", podDNSName(ss, r), controlPort(ss)))
	}
	if ss.Spec.InsecureControlPlane {
		c.AllowInsecure = true
	} else {
		// This rank's certificate, copied there by the pod's init container (tlsInitContainer).
		c.TLSDir = tlsMountPath
	}
	return c
}

// marshal is the configuration as the engine reads it.
func (c engineConfig) marshal() (string, error) {
	var b strings.Builder
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(c); err != nil {
		return "", fmt.Errorf("engine configuration: %w", err)
	}
	if err := enc.Close(); err != nil {
		return "", fmt.Errorf("engine configuration: %w", err)
	}
	return b.String(), nil
}
