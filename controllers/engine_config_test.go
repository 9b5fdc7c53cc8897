package controllers

import (
	"bytes"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// updateGolden rewrites testdata/engine-config/*.yaml from the renderer:
//
//	go test ./controllers/ -run TestEngineConfigGolden -update
//
// (or PEREGRINE_UPDATE_GOLDEN=1); review the diff before committing it.
var updateGolden = flag.Bool("update", false, "rewrite the golden files of controllers/testdata")

// goldenServerSet is a ServerSet as a user would write it (the defaults left to the operator).
func goldenServerSet(name string) *storagev1.ServerSet {
	return &storagev1.ServerSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "storage"},
		Spec: storagev1.ServerSetSpec{
			Image:   "peregrine/engine:dev",
			Engines: 3,
			Storage: storagev1.EngineStorage{
				Scm:      "1GiB",
				Emulated: &storagev1.EmulatedStorage{HostPath: "/var/lib/peregrine", Size: "8GiB"},
			},
		},
	}
}

// engineConfigCases are the ServerSets of the golden files, by file name.
func engineConfigCases() map[string]*storagev1.ServerSet {
	emulated := goldenServerSet("tank")

	nvme := goldenServerSet("fast")
	nvme.Spec.Storage.Emulated = nil
	nvme.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/disk/by-id/nvme-eui.0001"}
	nvme.Spec.Hugepages = ptrQuantity("2Gi")
	nvme.Spec.Targets = 8
	nvme.Spec.LogLevel = "debug"

	insecure := goldenServerSet("lab")
	insecure.Spec.InsecureControlPlane = true

	flush := goldenServerSet("durable")
	flush.Spec.FlushInterval = &metav1.Duration{Duration: 250 * time.Millisecond}

	replicas := goldenServerSet("quorum")
	replicas.Spec.Engines = 5
	replicas.Spec.MgmtSvcReplicas = 3
	replicas.Spec.ControlPort, replicas.Spec.DataPort = 11001, 11101

	return map[string]*storagev1.ServerSet{
		"emulated":       emulated,
		"nvme":           nvme,
		"insecure":       insecure,
		"flush-interval": flush,
		"replicas":       replicas,
	}
}

func ptrQuantity(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

func TestEngineConfigGolden(t *testing.T) {
	update := *updateGolden || os.Getenv("PEREGRINE_UPDATE_GOLDEN") == "1"
	dir := filepath.Join("testdata", "engine-config")
	hashes := map[string]string{}
	for name, ss := range engineConfigCases() {
		cm, err := renderConfigMap(ss)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := cm.Data[engineConfigKey]
		path := filepath.Join(dir, name+".yaml")
		if update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%s: %v (run with -update to write it)", name, err)
		}
		if got != string(want) {
			t.Errorf("%s: the rendered engine configuration differs from %s (-update rewrites it):\n--- got\n%s--- want\n%s",
				name, path, got, want)
		}
		// What the engine reads back is what was meant: no key the struct does not know.
		var back engineConfig
		dec := yaml.NewDecoder(strings.NewReader(got))
		dec.KnownFields(true)
		if err := dec.Decode(&back); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		for _, perPod := range []string{"rank:", "listen_addr:", "fault_domain:", "dns_name:", "path:", "@"} {
			if strings.Contains(got, perPod) {
				t.Errorf("%s: a per-pod value (%q) in the shared configuration:\n%s", name, perPod, got)
			}
		}
		h := configHash(cm)
		for other, oh := range hashes {
			if oh == h {
				t.Errorf("%s and %s: the same config hash %s for different configurations", name, other, h)
			}
		}
		hashes[name] = h
	}
	// Every golden file is one of the cases (a renamed case leaves none behind).
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) != len(hashes) {
		t.Errorf("%d golden files in %s for %d cases", len(files), dir, len(hashes))
	}
}

// A change of the configuration changes the pod template's hash (the engines roll); the same
// ServerSet renders the same hash.
func TestConfigHashFollowsTheConfiguration(t *testing.T) {
	hash := func(change func(*storagev1.ServerSet)) string {
		ss := goldenServerSet("tank")
		change(ss)
		cm, err := renderConfigMap(ss)
		if err != nil {
			t.Fatal(err)
		}
		return configHash(cm)
	}
	base := hash(func(*storagev1.ServerSet) {})
	if again := hash(func(*storagev1.ServerSet) {}); again != base {
		t.Fatalf("the same ServerSet, two hashes: %s, %s", base, again)
	}
	for what, change := range map[string]func(*storagev1.ServerSet){
		"flush interval": func(ss *storagev1.ServerSet) {
			ss.Spec.FlushInterval = &metav1.Duration{Duration: time.Second}
		},
		"log level": func(ss *storagev1.ServerSet) { ss.Spec.LogLevel = "debug" },
		"targets":   func(ss *storagev1.ServerSet) { ss.Spec.Targets = 4 },
		"scm size":  func(ss *storagev1.ServerSet) { ss.Spec.Storage.Scm = "2GiB" },
		"replicas":  func(ss *storagev1.ServerSet) { ss.Spec.MgmtSvcReplicas = 3 },
		"insecure":  func(ss *storagev1.ServerSet) { ss.Spec.InsecureControlPlane = true },
		"data port": func(ss *storagev1.ServerSet) { ss.Spec.DataPort = 12000 },
		"device size": func(ss *storagev1.ServerSet) {
			ss.Spec.Storage.Emulated.Size = "16GiB"
		},
	} {
		if hash(change) == base {
			t.Errorf("%s: the config hash did not change", what)
		}
	}
}

// The start script passes each pod's own values as flags, from the pod's environment; a stand-in
// engine on PATH prints the arguments it got.
func TestStartScriptPassesThePodsValues(t *testing.T) {
	dir := t.TempDir()
	fake := "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done\n"
	if err := os.WriteFile(filepath.Join(dir, "peregrine-engine"), []byte(fake), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(ss *storagev1.ServerSet, ordinal, podIP string) []string {
		t.Helper()
		sts := renderStatefulSet(ss, 3, 0, "h", "")
		env := []string{"PATH=" + dir + ":/usr/bin:/bin"}
		for _, v := range sts.Spec.Template.Spec.Containers[0].Env {
			val := v.Value
			if v.ValueFrom != nil {
				val = map[string]string{
					"metadata.name": ss.Name + "-" + ordinal, "metadata.namespace": ss.Namespace,
					"status.podIP": podIP, "spec.nodeName": "node-a",
				}[v.ValueFrom.FieldRef.FieldPath]
			}
			env = append(env, v.Name+"="+val)
		}
		cmd := exec.Command("/bin/sh", "-c", startScript)
		cmd.Env = env
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("start script: %v: %s", err, stderr.String())
		}
		return strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	}
	got := run(goldenServerSet("tank"), "2", "10.0.0.7")
	want := []string{
		"--config", "/etc/peregrine/engine.yaml",
		"--rank", "2", "--listen-addr", "10.0.0.7", "--fault-domain", "/node-a",
		"--dns-name", "tank-2.tank.storage.svc",
		"--bdev-path", "/var/lib/peregrine/tank-nvme2.img",
		"--metrics-listen", "10.0.0.7:9464",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("emulated NVMe, IPv4:\n got %q\nwant %q", got, want)
	}
	// The pod's DNS name is the one the replica list gives rank 0.
	if r0 := renderEngineConfig(goldenServerSet("tank")).MgmtSvcReplicas[0]; r0 != "tank-0.tank.storage.svc:10001" {
		t.Errorf("replica 0 is %q", r0)
	}

	nvme := goldenServerSet("fast")
	nvme.Spec.Storage.Emulated = nil
	nvme.Spec.Storage.Nvme = &storagev1.NvmeStorage{Device: "/dev/nvme0n1"}
	got = run(nvme, "0", "fd00::5")
	want = []string{
		"--config", "/etc/peregrine/engine.yaml",
		"--rank", "0", "--listen-addr", "fd00::5", "--fault-domain", "/node-a",
		"--dns-name", "fast-0.fast.storage.svc",
		"--metrics-listen", "[fd00::5]:9464",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("NVMe (no device file), IPv6:\n got %q\nwant %q", got, want)
	}
	for _, v := range renderStatefulSet(nvme, 1, 0, "h", "").Spec.Template.Spec.Containers[0].Env {
		if v.Name == "EMULATED_NVME_DIR" {
			t.Errorf("EMULATED_NVME_DIR on NVMe: %v", v)
		}
	}
}
