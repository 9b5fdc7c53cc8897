package controllers

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// What the ServerSet renders. Names derive from the ServerSet's name: the StatefulSet, the headless
// Service and the PodDisruptionBudget carry it as is, the ConfigMap adds "-config".
const (
	engineContainerName = "engine"
	configMountPath     = "/etc/peregrine"
	deviceMountPath     = "/var/lib/peregrine"
	configHashKey       = "storage.peregrine.dev/config-hash"
	labelServerSet      = "storage.peregrine.dev/serverset"
)

func engineLabels(ss *storagev1.ServerSet) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":       "peregrine-engine",
		"app.kubernetes.io/instance":   ss.Name,
		"app.kubernetes.io/managed-by": "peregrine-operator",
		labelServerSet:                 ss.Name,
	}
}

func engineSelector(ss *storagev1.ServerSet) map[string]string {
	return map[string]string{labelServerSet: ss.Name}
}

func configMapName(ss *storagev1.ServerSet) string { return ss.Name + "-config" }

// systemName is the engines' system name: the ServerSet's name in the engines' alphabet.
func systemName(ss *storagev1.ServerSet) string {
	n := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '-'
	}, ss.Name)
	if len(n) > 64 {
		n = n[:64]
	}
	return n
}

func metricsPort(ss *storagev1.ServerSet) int32 {
	if ss.Spec.MetricsPort == 0 {
		return 9464
	}
	return ss.Spec.MetricsPort
}

func controlPort(ss *storagev1.ServerSet) int32 {
	if ss.Spec.ControlPort == 0 {
		return 10001
	}
	return ss.Spec.ControlPort
}

func dataPort(ss *storagev1.ServerSet) int32 {
	if ss.Spec.DataPort == 0 {
		return 10101
	}
	return ss.Spec.DataPort
}

// podDNSName is the stable name of the engine pod of a rank behind the headless Service.
func podDNSName(ss *storagev1.ServerSet, rank int32) string {
	return fmt.Sprintf("%s-%d.%s.%s.svc", ss.Name, rank, ss.Name, ss.Namespace)
}

// defaultMgmtAddress is where the management service runs: rank 0, through the headless Service.
func defaultMgmtAddress(ss *storagev1.ServerSet) string {
	return fmt.Sprintf("%s:%d", podDNSName(ss, 0), controlPort(ss))
}

// mgmtAddress is the management service the operator talks to for this ServerSet.
func mgmtAddress(ss *storagev1.ServerSet) string {
	if a := ss.Annotations[storagev1.AnnotationMgmtAddress]; a != "" {
		return a
	}
	return defaultMgmtAddress(ss)
}

// startScript runs the engine of this pod: the configuration the ranks share (engineConfig), and
// this pod's own values as flags over it, from the downward API: the rank is the pod's ordinal,
// the listen address its IP, the fault domain its node, the DNS name its name behind the headless
// Service (the engine then recognizes itself in mgmt_svc_replicas), and on emulated NVMe its device
// file in the hostPath directory (EMULATED_NVME_DIR, set only then). Metrics listen on the pod IP,
// as the control and data ports (pods of the host network share the node's addresses).
//
// The image's engine and this script come from the same release: an engine that predates the
// flags refuses them (unexpected argument '--rank') and the pod fails at start, never running
// without the TLS it is told to use.
const startScript = `#!/bin/sh
set -eu
rank="${POD_NAME##*-}"
set -- --rank "${rank}" --listen-addr "${POD_IP}" --fault-domain "/${NODE_NAME}" \
    --dns-name "${POD_NAME}.${SERVICE_NAME}.${POD_NAMESPACE}.svc"
if [ -n "${EMULATED_NVME_DIR:-}" ]; then
    set -- "$@" --bdev-path "${EMULATED_NVME_DIR}/${SERVICE_NAME}-nvme${rank}.img"
fi
if [ -n "${METRICS_PORT:-}" ]; then
    case "${POD_IP}" in *:*) host="[${POD_IP}]" ;; *) host="${POD_IP}" ;; esac
    set -- "$@" --metrics-listen "${host}:${METRICS_PORT}"
fi
# Privileged engines (NVMe) can lift it; unprivileged ones keep it (no CAP_SYS_RESOURCE) and lock
# memory through CAP_IPC_LOCK regardless.
ulimit -l unlimited 2>/dev/null || echo "start-engine: memlock limit stays $(ulimit -l); CAP_IPC_LOCK locks memory regardless" >&2
exec peregrine-engine --config ` + configMountPath + `/` + engineConfigKey + ` "$@"
`

func hugepages(ss *storagev1.ServerSet) *resource.Quantity {
	if ss.Spec.Hugepages == nil {
		return &resource.Quantity{}
	}
	return ss.Spec.Hugepages
}

// renderConfigMap is the engines' configuration and start script.
func renderConfigMap(ss *storagev1.ServerSet) (*corev1.ConfigMap, error) {
	cfg, err := renderEngineConfig(ss).marshal()
	if err != nil {
		return nil, err
	}
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: configMapName(ss), Namespace: ss.Namespace, Labels: engineLabels(ss)},
		Data: map[string]string{
			engineConfigKey: cfg,
			startScriptKey:  startScript,
		},
	}, nil
}

// configHash is the pod template's: the engines read the ConfigMap at start, so a change of it
// rolls them.
func configHash(cm *corev1.ConfigMap) string {
	h := sha256.New()
	for _, k := range []string{engineConfigKey, startScriptKey} {
		h.Write([]byte(k))
		h.Write([]byte(cm.Data[k]))
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func renderService(ss *storagev1.ServerSet) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: ss.Name, Namespace: ss.Namespace, Labels: engineLabels(ss)},
		Spec: corev1.ServiceSpec{
			ClusterIP: corev1.ClusterIPNone,
			Selector:  engineSelector(ss),
			// Engines find the management service before they are ready.
			PublishNotReadyAddresses: true,
			Ports: []corev1.ServicePort{
				{Name: "control", Port: controlPort(ss), TargetPort: intstr.FromString("control")},
				{Name: "data", Port: dataPort(ss), TargetPort: intstr.FromString("data")},
				{Name: "metrics", Port: metricsPort(ss), TargetPort: intstr.FromString("metrics")},
			},
		},
	}
}

func renderPDB(ss *storagev1.ServerSet) *policyv1.PodDisruptionBudget {
	one := intstr.FromInt32(1)
	return &policyv1.PodDisruptionBudget{
		ObjectMeta: metav1.ObjectMeta{Name: ss.Name, Namespace: ss.Namespace, Labels: engineLabels(ss)},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable: &one,
			Selector:       &metav1.LabelSelector{MatchLabels: engineSelector(ss)},
		},
	}
}

// engineResources adds to the user's resources what the engine needs: hugepages-2Mi with
// requests equal to limits, and a memory request (the API server requires one beside hugepages)
// covering the SCM tier.
func engineResources(ss *storagev1.ServerSet) corev1.ResourceRequirements {
	res := *ss.Spec.Resources.DeepCopy()
	if res.Requests == nil {
		res.Requests = corev1.ResourceList{}
	}
	if res.Limits == nil {
		res.Limits = corev1.ResourceList{}
	}
	hp := hugepages(ss)
	if hp.Sign() > 0 {
		res.Requests[corev1.ResourceHugePagesPrefix+"2Mi"] = hp.DeepCopy()
		res.Limits[corev1.ResourceHugePagesPrefix+"2Mi"] = hp.DeepCopy()
	}
	if _, ok := res.Requests[corev1.ResourceMemory]; !ok {
		scm, err := ss.Spec.Storage.Scm.Bytes()
		if err == nil {
			mem := resource.NewQuantity(int64(scm)+256<<20, resource.BinarySI)
			res.Requests[corev1.ResourceMemory] = *mem
			if _, ok := res.Limits[corev1.ResourceMemory]; !ok && hp.Sign() > 0 {
				res.Limits[corev1.ResourceMemory] = *mem
			}
		}
	}
	return res
}

// renderStatefulSet renders the engines; replicas is what the reconciler decided (it refuses to
// scale down); tlsHash is the certificates' (serverset_tls.go; "" for an insecure control plane).
func renderStatefulSet(ss *storagev1.ServerSet, replicas, partition int32, cfgHash, tlsHash string) *appsv1.StatefulSet {
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}},
		{Name: "SERVICE_NAME", Value: ss.Name},
		{Name: "METRICS_PORT", Value: fmt.Sprint(metricsPort(ss))},
	}
	// The engine config has no fabric keys (engine/crates/engine/src/config.rs rejects unknown
	// ones), so the fabric settings travel as environment only.
	if ss.Spec.Fabric.Provider != "" {
		env = append(env, corev1.EnvVar{Name: "PEREGRINE_FABRIC_PROVIDER", Value: ss.Spec.Fabric.Provider})
	}
	if ss.Spec.Fabric.Interface != "" {
		env = append(env, corev1.EnvVar{Name: "PEREGRINE_FABRIC_INTERFACE", Value: ss.Spec.Fabric.Interface})
	}
	// The start script names the pod's device file in it (--bdev-path).
	if ss.Spec.Storage.Nvme == nil && ss.Spec.Storage.Emulated != nil {
		env = append(env, corev1.EnvVar{Name: "EMULATED_NVME_DIR", Value: deviceMountPath})
	}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: configMountPath, ReadOnly: true}}
	volumes := []corev1.Volume{{
		Name: "config",
		VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: configMapName(ss)},
			DefaultMode:          ptr.To[int32](0o755),
		}},
	}}
	if hugepages(ss).Sign() > 0 {
		mounts = append(mounts, corev1.VolumeMount{Name: "hugepages", MountPath: "/dev/hugepages"})
		volumes = append(volumes, corev1.Volume{Name: "hugepages", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumHugePagesPrefix + "2Mi"},
		}})
	}
	switch {
	case ss.Spec.Storage.Nvme != nil:
		dev := ss.Spec.Storage.Nvme.Device
		mounts = append(mounts, corev1.VolumeMount{Name: "nvme", MountPath: dev})
		volumes = append(volumes, corev1.Volume{Name: "nvme", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: dev, Type: ptr.To(corev1.HostPathBlockDev)},
		}})
	case ss.Spec.Storage.Emulated != nil:
		mounts = append(mounts, corev1.VolumeMount{Name: "devices", MountPath: deviceMountPath})
		volumes = append(volumes, corev1.Volume{Name: "devices", VolumeSource: corev1.VolumeSource{
			HostPath: &corev1.HostPathVolumeSource{Path: ss.Spec.Storage.Emulated.HostPath, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
		}})
	}
	annotations := map[string]string{
		configHashKey: cfgHash,
		// For Prometheus set up to scrape annotated pods (the chart's PodMonitor uses the port name).
		"prometheus.io/scrape": "true",
		"prometheus.io/port":   fmt.Sprint(metricsPort(ss)),
		"prometheus.io/path":   "/metrics",
	}
	var initContainers []corev1.Container
	if tlsHash != "" {
		mounts = append(mounts, corev1.VolumeMount{Name: "tls", MountPath: tlsMountPath, ReadOnly: true})
		volumes = append(volumes, tlsVolume(ss), corev1.Volume{Name: "tls", VolumeSource: corev1.VolumeSource{
			EmptyDir: &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("1Mi"))}}})
		initContainers = append(initContainers, tlsInitContainer(ss))
		// The engines read their certificates at start: a renewal or a CA rotation step rolls them.
		annotations[tlsHashKey] = tlsHash
	}
	dnsPolicy := corev1.DNSClusterFirst
	if ss.Spec.HostNetwork {
		dnsPolicy = corev1.DNSClusterFirstWithHostNet
	}
	podLabels := engineLabels(ss)
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: ss.Name, Namespace: ss.Namespace, Labels: engineLabels(ss)},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    ptr.To(replicas),
			ServiceName: ss.Name,
			Selector:    &metav1.LabelSelector{MatchLabels: engineSelector(ss)},
			// Engines start together: the first format waits for all of them to join.
			PodManagementPolicy: appsv1.ParallelPodManagement,
			// One engine at a time: the operator lowers the partition (serverset_upgrade.go) only
			// when the management service sees the system whole again.
			UpdateStrategy: appsv1.StatefulSetUpdateStrategy{
				Type: appsv1.RollingUpdateStatefulSetStrategyType,
				RollingUpdate: &appsv1.RollingUpdateStatefulSetStrategy{
					MaxUnavailable: ptr.To(intstr.FromInt32(1)),
					Partition:      ptr.To(partition),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: annotations},
				Spec: corev1.PodSpec{
					HostNetwork:                   ss.Spec.HostNetwork,
					DNSPolicy:                     dnsPolicy,
					NodeSelector:                  ss.Spec.NodeSelector,
					Affinity:                      ss.Spec.Affinity,
					Tolerations:                   ss.Spec.Tolerations,
					TerminationGracePeriodSeconds: ptr.To[int64](60),
					InitContainers:                initContainers,
					Containers: []corev1.Container{{
						Name:            engineContainerName,
						Image:           ss.Spec.Image,
						ImagePullPolicy: ss.Spec.ImagePullPolicy,
						Command:         []string{"/bin/sh", configMountPath + "/" + startScriptKey},
						Env:             env,
						Ports: []corev1.ContainerPort{
							{Name: "control", ContainerPort: controlPort(ss)},
							{Name: "data", ContainerPort: dataPort(ss)},
							{Name: "metrics", ContainerPort: metricsPort(ss)},
						},
						Resources:       engineResources(ss),
						SecurityContext: engineSecurityContext(ss),
						ReadinessProbe: &corev1.Probe{
							ProbeHandler:  corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString("data")}},
							PeriodSeconds: 5,
						},
						VolumeMounts: mounts,
					}},
					Volumes: volumes,
				},
			},
		},
	}
}

// engineSecurityContext is the engine container's privilege: privileged only for a kernel block
// device (needsPrivileged); otherwise no privilege escalation and, of all capabilities, IPC_LOCK
// alone: the engine mlocks its I/O buffers when it has no hugepages, and the buffers it
// registers with io_uring count against RLIMIT_MEMLOCK unless it holds CAP_IPC_LOCK. (The start
// script's `ulimit -l unlimited` then fails without CAP_SYS_RESOURCE, harmlessly: IPC_LOCK
// ignores the limit.) Everything else the engine does on emulated NVMe (O_DIRECT on a file of the
// hostPath directory, MAP_HUGETLB from the pod's hugepages, a unix socket beside its device file,
// TCP on unprivileged ports) needs none.
//
// The seccomp profile is left to the kubelet's default (Unconfined unless seccompDefault is on):
// a runtime's default profile may refuse io_uring_setup (containerd 2.x's does), and the engine
// then runs its device I/O with pread/pwrite (engine/crates/vos/src/device.rs warns "io_uring
// unavailable") at a fraction of the IOPS. docs/security.md has the trade-off.
func engineSecurityContext(ss *storagev1.ServerSet) *corev1.SecurityContext {
	if needsPrivileged(ss) {
		return &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	return &corev1.SecurityContext{
		Privileged:               ptr.To(false),
		AllowPrivilegeEscalation: ptr.To(false),
		Capabilities: &corev1.Capabilities{
			Drop: []corev1.Capability{"ALL"},
			Add:  []corev1.Capability{"IPC_LOCK"},
		},
	}
}

// tlsVolume is every rank's certificate (Secret NAME-engine-tls: ca.crt, RANK.crt, RANK.key): a
// StatefulSet has one pod template for all its pods, so a pod cannot mount only its own rank's
// Secret. Only the pod's init container mounts it (tlsInitContainer): the engine container sees
// its own rank's certificate alone. One Secret rather than a projection of the per-rank ones:
// a new rank then changes the Secret, not the pod template, and a scale-up rolls nothing.
func tlsVolume(ss *storagev1.ServerSet) corev1.Volume {
	return corev1.Volume{Name: "tls-ranks", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: engineBundleSecretName(ss), DefaultMode: ptr.To[int32](0o400),
	}}}
}

// tlsRanksMountPath is where the init container sees every rank's certificate.
const tlsRanksMountPath = "/etc/peregrine-tls-ranks"

// tlsInitScript copies this pod's rank's certificate (the ordinal ends the pod's name) into the
// in-memory volume the engine reads (tls_dir). A new rank's pod may start before the kubelet has
// the Secret's update that added it: it waits for it (two minutes, then fails and is restarted).
// The copies of an earlier start go first: a pod whose sandbox is re-created (a node restart)
// keeps its in-memory volume, and the script, holding no capability, cannot write over the 0400
// files it left there.
const tlsInitScript = `set -eu
rank="${POD_NAME##*-}"
src=` + tlsRanksMountPath + `
n=0
until [ -s "$src/$rank.crt" ] && [ -s "$src/$rank.key" ]; do
  n=$((n + 1))
  [ "$n" -le 120 ] || { echo "tls: no certificate for rank $rank in $src" >&2; exit 1; }
  sleep 1
done
rm -f ` + tlsMountPath + `/ca.crt ` + tlsMountPath + `/tls.crt ` + tlsMountPath + `/tls.key
cp "$src/ca.crt" ` + tlsMountPath + `/ca.crt
cp "$src/$rank.crt" ` + tlsMountPath + `/tls.crt
cp "$src/$rank.key" ` + tlsMountPath + `/tls.key
chmod 0400 ` + tlsMountPath + `/*
`

// tlsInitContainer copies the pod's own certificate out of the volume of every rank's, so that a
// compromised engine container holds no other rank's key. It runs at every pod start (a roll
// recreates the pods; a restarted engine container keeps the copy of its pod's start).
func tlsInitContainer(ss *storagev1.ServerSet) corev1.Container {
	return corev1.Container{
		Name:            "tls",
		Image:           ss.Spec.Image,
		ImagePullPolicy: ss.Spec.ImagePullPolicy,
		Command:         []string{"/bin/sh", "-c", tlsInitScript},
		Env: []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		// Root reads the 0400 files it owns without any capability.
		SecurityContext: &corev1.SecurityContext{
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{
			{Name: "tls-ranks", MountPath: tlsRanksMountPath, ReadOnly: true},
			{Name: "tls", MountPath: tlsMountPath},
		},
	}
}
