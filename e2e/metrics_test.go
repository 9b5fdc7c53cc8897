package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
)

// Suite: metrics (docs/metrics.md). After the earlier specs' I/O (1 GiB written through an
// EC_2P1G1 PVC, read back by a plain pod and by an intercepted one), every engine pod serves
// /metrics on its port named "metrics", read here through the API server's pod proxy as a
// Prometheus in the cluster would reach it, and its counters account for that I/O; the
// operator's metrics (HTTPS, for callers allowed to get /metrics: read through a port-forward
// with a ServiceAccount's token, since the API server's proxy drops the caller's Authorization)
// tie the Pool to the UUID the engines label their series with.
// An engine counts from its start: these specs come before any that restart engines.

// metricSample is one sample of the Prometheus text format.
type metricSample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics parses the Prometheus text format, failing the spec on a malformed line.
func parseMetrics(text string) []metricSample {
	var out []metricSample
	for _, line := range strings.Split(text, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		Expect(i).To(BeNumerically(">", 0), "sample line %q", line)
		series, v := line[:i], line[i+1:]
		value, err := strconv.ParseFloat(v, 64)
		Expect(err).NotTo(HaveOccurred(), "value of %q", line)
		s := metricSample{name: series, labels: map[string]string{}}
		if j := strings.IndexByte(series, '{'); j >= 0 {
			Expect(series).To(HaveSuffix("}"), "labels of %q", line)
			s.name = series[:j]
			rest := series[j+1 : len(series)-1]
			for rest != "" {
				k, after, ok := strings.Cut(rest, `="`)
				Expect(ok).To(BeTrue(), "label in %q", line)
				var val strings.Builder
				n := 0
				for ; n < len(after) && after[n] != '"'; n++ {
					if after[n] == '\\' && n+1 < len(after) {
						n++
					}
					val.WriteByte(after[n])
				}
				Expect(n).To(BeNumerically("<", len(after)), "closing quote in %q", line)
				s.labels[k] = val.String()
				rest = strings.TrimPrefix(after[n+1:], ",")
			}
		}
		s.value = value
		out = append(out, s)
	}
	return out
}

// sumMetric adds the samples named name whose labels include match.
func sumMetric(samples []metricSample, name string, match map[string]string) float64 {
	var sum float64
next:
	for _, s := range samples {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		sum += s.value
	}
	return sum
}

// podPort is the number of the container port named name in the pod (0 if none).
func podPort(p *corev1.Pod, name string) int32 {
	for _, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			if port.Name == name {
				return port.ContainerPort
			}
		}
	}
	return 0
}

// scrapePod reads a pod's /metrics on its port named "metrics", through the API server's proxy.
func scrapePod(ctx context.Context, p *corev1.Pod) []metricSample {
	port := podPort(p, "metrics")
	Expect(port).NotTo(BeZero(), "pod %s has no port named metrics", p.Name)
	body, err := cs.CoreV1().Pods(p.Namespace).ProxyGet("http", p.Name, fmt.Sprint(port), "/metrics", nil).DoRaw(ctx)
	Expect(err).NotTo(HaveOccurred(), "GET /metrics of pod %s: %s", p.Name, body)
	return parseMetrics(string(body))
}

func metricsSpecs(ctx context.Context) {
	It("serves every engine's metrics, whose counters account for the GiB written and read", func() {
		pool := &storagev1.Pool{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, pool)).To(Succeed())
		uuid := pool.Status.UUID
		Expect(uuid).NotTo(BeEmpty())
		inPool := map[string]string{"pool": uuid}

		pods := &corev1.PodList{}
		Expect(k8s.List(ctx, pods, client.InNamespace(storeNS),
			client.MatchingLabels{"storage.peregrine.dev/serverset": storeName})).To(Succeed())
		Expect(pods.Items).NotTo(BeEmpty())
		var update, fetch, updates, fetches, upin, observed float64
		for i := range pods.Items {
			p := &pods.Items[i]
			Expect(p.Annotations).To(HaveKeyWithValue("prometheus.io/scrape", "true"))
			Expect(p.Annotations).To(HaveKeyWithValue("prometheus.io/port", fmt.Sprint(podPort(p, "metrics"))))
			s := scrapePod(ctx, p)
			Expect(sumMetric(s, "peregrine_engine_ready", nil)).To(Equal(1.0), "pod %s", p.Name)
			b := sumMetric(s, "peregrine_target_update_bytes_total", inPool)
			GinkgoWriter.Printf("%s: update bytes %.0f, fetch bytes %.0f, WAL records %.0f, nvme used %.0f\n", p.Name, b,
				sumMetric(s, "peregrine_target_fetch_bytes_total", inPool),
				sumMetric(s, "peregrine_target_wal_records_total", nil),
				sumMetric(s, "peregrine_pool_space_used_bytes", map[string]string{"pool": uuid, "tier": "nvme"}))
			update += b
			fetch += sumMetric(s, "peregrine_target_fetch_bytes_total", inPool)
			updates += sumMetric(s, "peregrine_target_ops_total", map[string]string{"pool": uuid, "op": "update"})
			fetches += sumMetric(s, "peregrine_target_ops_total", map[string]string{"pool": uuid, "op": "fetch"})
			observed += sumMetric(s, "peregrine_target_update_latency_seconds_count", inPool)
			upin += sumMetric(s, "peregrine_pool_targets", map[string]string{"pool": uuid, "state": "upin"})
			Expect(sumMetric(s, "peregrine_target_wal_records_total", nil)).To(BeNumerically(">", 0), "pod %s", p.Name)
			Expect(sumMetric(s, "peregrine_pool_space_size_bytes", map[string]string{"pool": uuid, "tier": "nvme"})).
				To(BeNumerically(">", 0), "pod %s", p.Name)
		}
		// EC_2P1G1 stores the data cells and a parity cell: at least the GiB written.
		Expect(update).To(BeNumerically(">=", 1<<30), "update bytes over every engine")
		Expect(fetch).To(BeNumerically(">", 0), "fetch bytes over every engine")
		Expect(updates).To(BeNumerically(">", 0))
		Expect(fetches).To(BeNumerically(">", 0))
		Expect(observed).To(BeNumerically(">", 0), "update latency observations")
		Expect(upin).To(BeEquivalentTo(pool.Status.TotalTargets), "every target of the pool up and in")
	})

	It("serves the operator's metrics over HTTPS to authorized callers only, and they name the pool's UUID", func() {
		pool := &storagev1.Pool{}
		Expect(k8s.Get(ctx, client.ObjectKey{Namespace: storeNS, Name: storeName}, pool)).To(Succeed())
		ops := &corev1.PodList{}
		Expect(k8s.List(ctx, ops, client.InNamespace(releaseNS), client.MatchingLabels{"app.kubernetes.io/name": "peregrine-operator"})).To(Succeed())
		// An evicted or finished pod of an earlier ReplicaSet stays listed; it serves nothing.
		var running []*corev1.Pod
		for i := range ops.Items {
			if p := &ops.Items[i]; p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				running = append(running, p)
			}
		}
		Expect(running).NotTo(BeEmpty(), "no running operator pod among %d", len(ops.Items))
		// A scraper's identity: a ServiceAccount bound to peregrine-metrics-reader, and one that is not.
		scraper, stranger := metricsToken(ctx, "e2e-metrics-scraper", true), metricsToken(ctx, "e2e-metrics-stranger", false)
		for _, p := range running {
			code, _ := scrapeOperator(ctx, p, "")
			Expect(code).To(Equal(http.StatusUnauthorized), "pod %s without a token", p.Name)
			code, _ = scrapeOperator(ctx, p, stranger)
			Expect(code).To(Equal(http.StatusForbidden), "pod %s with a token not allowed to get /metrics", p.Name)
		}
		// Only the leader reconciles, so only its metrics carry the pool.
		Eventually(func() float64 {
			var n float64
			for _, p := range running {
				code, body := scrapeOperator(ctx, p, scraper)
				Expect(code).To(Equal(http.StatusOK), "pod %s: %.300s", p.Name, body)
				n += sumMetric(parseMetrics(body), "peregrine_pool_info",
					map[string]string{"namespace": storeNS, "pool": storeName, "uuid": pool.Status.UUID})
			}
			return n
		}).Should(Equal(1.0))
	})
}

// metricsToken returns a token of a ServiceAccount of the run's namespace, bound to the ClusterRole
// peregrine-metrics-reader when reader (the binding goes with the namespace's ServiceAccount: it
// is deleted after the spec).
func metricsToken(ctx context.Context, name string, reader bool) string {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, sa))).To(Succeed())
	if reader {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "peregrine-metrics-reader"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}},
		}
		Expect(client.IgnoreAlreadyExists(k8s.Create(ctx, crb))).To(Succeed())
		DeferCleanup(func(ctx context.Context) { Expect(client.IgnoreNotFound(k8s.Delete(ctx, crb))).To(Succeed()) })
	}
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](600)},
	}, metav1.CreateOptions{})
	Expect(err).NotTo(HaveOccurred())
	return tr.Status.Token
}

// scrapeOperator GETs https://POD:metrics/metrics through a port-forward, with a bearer token
// when tok is set, and returns the status code and body (retrying until the RBAC of a new binding
// is in effect is the caller's business).
func scrapeOperator(ctx context.Context, p *corev1.Pod, tok string) (int, string) {
	port := podPort(p, "metrics")
	Expect(port).NotTo(BeZero(), "pod %s has no port named metrics", p.Name)
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	Expect(err).NotTo(HaveOccurred())
	u, err := url.Parse(cs.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("portforward").URL().String())
	Expect(err).NotTo(HaveOccurred())
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	stop, ready := make(chan struct{}), make(chan struct{})
	defer close(stop)
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, GinkgoWriter, GinkgoWriter)
	Expect(err).NotTo(HaveOccurred())
	errs := make(chan error, 1)
	go func() { errs <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-errs:
		Fail(fmt.Sprintf("port-forward to %s: %v", p.Name, err))
	case <-time.After(30 * time.Second):
		Fail("port-forward to " + p.Name + ": not ready in 30 s")
	}
	fwd, err := fw.GetPorts()
	Expect(err).NotTo(HaveOccurred())
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		// The operator's certificate is self-signed (made at its start); the token is what counts.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		"https://"+net.JoinHostPort("127.0.0.1", fmt.Sprint(fwd[0].Local))+"/metrics", nil)
	Expect(err).NotTo(HaveOccurred())
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := hc.Do(req)
	Expect(err).NotTo(HaveOccurred(), "GET /metrics of %s over HTTPS", p.Name)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	Expect(err).NotTo(HaveOccurred())
	return resp.StatusCode, string(body)
}
