package controllers

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/mgmtpb"
)

// series reads the gauges named name from controller-runtime's registry, the one the manager's
// /metrics endpoint serves, keeping those whose labels include match. Each series is keyed by
// its labels other than match's, as "k=v,k=v" in label order.
func series(name string, match map[string]string) map[string]float64 {
	families, err := metrics.Registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	metric:
		for _, m := range f.GetMetric() {
			var rest []string
			seen := 0
			for _, l := range m.GetLabel() {
				want, ok := match[l.GetName()]
				switch {
				case ok && want != l.GetValue():
					continue metric
				case ok:
					seen++
				default:
					rest = append(rest, l.GetName()+"="+l.GetValue())
				}
			}
			if seen == len(match) {
				out[strings.Join(rest, ",")] = m.GetGauge().GetValue()
			}
		}
	}
	return out
}

// poolSeries is what peregrine_pool_bytes should hold for a pool, from a PoolQuery answer.
func poolSeries(info *mgmtpb.PoolInfo) map[string]float64 {
	out := map[string]float64{}
	for _, t := range info.Tiers {
		out["kind=free,tier="+t.Name] = float64(t.Free)
		out["kind=total,tier="+t.Name] = float64(t.Total)
	}
	return out
}

// putObject writes value into a container through the data plane, with the store's CLI.
func putObject(msAddr, pool, cont, oid string, value []byte) {
	f := filepath.Join(GinkgoT().TempDir(), "value")
	Expect(os.WriteFile(f, value, 0o644)).To(Succeed())
	cli := filepath.Join(filepath.Dir(engineBin), "peregrine")
	systemsMu.Lock()
	tlsDir, insecure := adminDirs[msAddr], insecureAddrs[msAddr]
	systemsMu.Unlock()
	args := []string{"--mgmt", msAddr, "--timeout", "30", "obj", "put", pool, cont, oid, "d", "a", "--array", "--file", f}
	switch {
	case !insecure:
		args = append([]string{"--tls-dir", tlsDir}, args...)
	case engineTLS:
		args = append([]string{"--insecure"}, args...) // a CLI with TLS wants the choice said
	}
	out, err := exec.Command(cli, args...).CombinedOutput()
	Expect(err).NotTo(HaveOccurred(), "%s obj put: %s", cli, out)
}

var _ = Describe("Capacity gauges", Ordered, func() {
	const ns = "default"
	var (
		ms     mgmtpb.MgmtClient
		msAddr string
	)

	BeforeAll(func() {
		e := startEngine("gauge", false)
		msAddr = e.addr
		ms = msClient(e.addr)
		Expect(k8s.Create(ctx, newServerSet("gauge", e.addr, 1))).To(Succeed())
		Eventually(func() int32 { return getServerSet("gauge")().Status.ReadyEngines }, 60*time.Second).Should(Equal(int32(1)))
	})

	waitState := func(get func() string, state string) {
		Eventually(get, 60*time.Second).Should(Equal(state))
	}

	It("export each pool's space per tier and each container's used bytes as the management service reports them", func() {
		Expect(k8s.Create(ctx, newPool("meter", "gauge", "128MiB"))).To(Succeed())
		waitState(func() string { return string(getPool("meter").Status.State) }, string(storagev1.PoolStateReady))
		Expect(k8s.Create(ctx, newContainer("readings", "meter"))).To(Succeed())
		waitState(func() string { return string(getContainer("readings").Status.State) }, string(storagev1.ContainerStateReady))

		By("writing 3 MiB into the container through the data plane")
		value := make([]byte, 3<<20)
		for i := range value {
			value[i] = byte(i*7 + i>>12)
		}
		putObject(msAddr, "meter", "readings", "SX:1.1", value)

		By("the gauges follow PoolQuery and ContQuery")
		var cont *mgmtpb.ContInfo
		Eventually(func(g Gomega) {
			info, err := ms.PoolQuery(ctx, &mgmtpb.PoolQueryReq{Id: "meter"})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(info.Tiers).NotTo(BeEmpty())
			g.Expect(series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter"})).To(Equal(poolSeries(info)))
			cont, err = ms.ContQuery(ctx, &mgmtpb.ContQueryReq{Pool: "meter", Id: "readings"})
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(series("peregrine_container_used_bytes", map[string]string{"namespace": ns, "container": "readings"})).
				To(Equal(map[string]float64{"pool=meter": float64(cont.UsedBytes)}))
		}, 30*time.Second, 200*time.Millisecond).Should(Succeed())
		Expect(cont.UsedBytes).To(BeNumerically(">=", 3<<20), "the written bytes are counted")
		By("naming the pool's UUID, which the engines' metrics carry")
		Expect(series("peregrine_pool_info", map[string]string{"namespace": ns, "pool": "meter"})).
			To(Equal(map[string]float64{"label=meter,uuid=" + getPool("meter").Status.UUID: 1}))
		GinkgoWriter.Println("container used bytes:", cont.UsedBytes, "pool gauges:",
			series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter"}))
		free := series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter", "kind": "free"})
		total := series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter", "kind": "total"})
		var freeSum, totalSum float64
		for k := range total {
			freeSum, totalSum = freeSum+free[k], totalSum+total[k]
		}
		Expect(totalSum-freeSum).To(BeNumerically(">=", 3<<20), "the pool's free space went down by what was written")
	})

	It("drop a container's and a pool's series when they are deleted", func() {
		Expect(k8s.Delete(ctx, getContainer("readings"))).To(Succeed())
		Eventually(func() map[string]float64 {
			return series("peregrine_container_used_bytes", map[string]string{"namespace": ns, "container": "readings"})
		}, 30*time.Second).Should(BeEmpty())
		Expect(series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter"})).NotTo(BeEmpty(),
			"the pool is still there")

		p := getPool("meter")
		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Eventually(gone(p), 60*time.Second).Should(BeTrue())
		Expect(series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "meter"})).To(BeEmpty())
		Expect(series("peregrine_pool_info", map[string]string{"namespace": ns, "pool": "meter"})).To(BeEmpty())
	})

	It("drop the series of a pool and a container that vanished from the store", func() {
		Expect(k8s.Create(ctx, newPool("fleeting", "gauge", "64MiB"))).To(Succeed())
		waitState(func() string { return string(getPool("fleeting").Status.State) }, string(storagev1.PoolStateReady))
		Expect(k8s.Create(ctx, newContainer("fleeting-data", "fleeting"))).To(Succeed())
		waitState(func() string { return string(getContainer("fleeting-data").Status.State) }, string(storagev1.ContainerStateReady))
		Eventually(func() map[string]float64 {
			return series("peregrine_container_used_bytes", map[string]string{"namespace": ns, "container": "fleeting-data"})
		}, 30*time.Second).Should(HaveLen(1))
		Expect(series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "fleeting"})).NotTo(BeEmpty())

		By("destroying both in the store, behind the operator's back")
		_, err := ms.ContDestroy(ctx, &mgmtpb.ContDestroyReq{Pool: "fleeting", Id: "fleeting-data"})
		Expect(err).NotTo(HaveOccurred())
		_, err = ms.PoolDestroy(ctx, &mgmtpb.PoolDestroyReq{Id: "fleeting"})
		Expect(err).NotTo(HaveOccurred())
		waitState(func() string { return string(getContainer("fleeting-data").Status.State) }, string(storagev1.ContainerStateLost))
		waitState(func() string { return string(getPool("fleeting").Status.State) }, string(storagev1.PoolStateLost))
		Expect(series("peregrine_container_used_bytes", map[string]string{"namespace": ns, "container": "fleeting-data"})).To(BeEmpty())
		Expect(series("peregrine_pool_bytes", map[string]string{"namespace": ns, "pool": "fleeting"})).To(BeEmpty())

		By("cleaning up the objects")
		c, p := getContainer("fleeting-data"), getPool("fleeting")
		Expect(k8s.Delete(ctx, c)).To(Succeed())
		Expect(k8s.Delete(ctx, p)).To(Succeed())
		Eventually(gone(p), 60*time.Second).Should(BeTrue())
	})
})
