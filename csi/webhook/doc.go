// Package webhook is the mutating admission webhook that preloads Peregrine's interception library
// (libperegrine_il.so) into the pods that ask for it, and the operator-side keeper of its TLS
// certificate.
//
// # What a pod gets
//
// A pod annotated
//
//	peregrine.dev/intercept: "true"
//
// (exactly "true"; any other value, or no annotation, leaves the pod untouched) gets:
//
//   - per image of its regular containers, a check container (an init container named
//     peregrine-il-check-N, running that image) that runs the static checker peregrine-il-check
//     from the node plugin's directory (the hostPath volume "peregrine-il-host", type Directory, by
//     default /var/lib/peregrine/il, the operator's --il-host-dir, mounted read-only at
//     /opt/peregrine/il-host) and fills the subdirectory N of the emptyDir "peregrine-il";
//   - in each regular container, a read-only mount of its image's subdirectory at
//     /opt/peregrine/il, and LD_PRELOAD=/opt/peregrine/il/libperegrine_il.so, appended with ':'
//     (the glibc separator) to an LD_PRELOAD the container already sets, and not added twice;
//   - PEREGRINE_IL_REPORT=1 as well when the pod is annotated peregrine.dev/intercept-report: "true"
//     (the library prints what it intercepted at exit), unless the container sets it itself.
//
// Containers named in peregrine.dev/intercept-exclude: "name1,name2" are left alone.
//
// Init containers are not patched, on purpose: they run setup steps (copying, waiting, chowning)
// to completion before the workload starts, not the long-running I/O the library speeds up, so
// preloading into them adds a failure surface for no gain. An application that wants
// interception in an init container can set LD_PRELOAD and the mount itself.
//
// Patching is idempotent: a pod that already has the volumes, the check containers, the mounts and
// the library in LD_PRELOAD is returned unchanged (an empty patch), which matters because the
// webhook is registered with reinvocationPolicy IfNeeded and is called again when a later webhook
// changes the pod; a container or image a later webhook added gets its check then.
//
// # Images without a compatible libc
//
// The library is a glibc ELF shared object (glibc 2.34 or newer; its ISA-L beside it). Where a
// loader finds it and cannot bind it (an older glibc: a missing symbol version; musl: missing
// glibc symbols), the error is fatal: the program does not start. The webhook cannot see an
// image's C library at admission, so the check container looks inside the image (package
// csi/ilcheck): it runs a dynamically linked glibc program of the image (the container's own
// command first) with the library preloaded, whose constructor answers and ends the process before
// the program's main runs, and copies the library and ISA-L into the subdirectory only when it
// answered. Otherwise the pod starts without interception: in an image with an older glibc, the
// image's own libc.so.6 stands in under the library's name (glibc would print an error for a
// missing file at every program start; the same libc preloaded changes nothing); a musl image
// ignores the missing file; static programs never read LD_PRELOAD. The check prints one line that
// says which (kubectl logs POD -c peregrine-il-check-0) and always exits 0.
//
// The check container runs as its container does: same image, pull policy and security context,
// its CPU and memory requests and limits (so it passes the same LimitRange and quota checks and
// adds nothing to the pod's requests), not its extended resources (GPUs).
//
// # Limits
//
// An LD_PRELOAD a container takes from a ConfigMap or Secret (env valueFrom) is left as it is (the
// container is skipped with an admission warning): its value is not known at admission. An
// LD_PRELOAD that arrives through envFrom cannot be seen either; the explicit env entry this webhook
// adds takes precedence over it. A container that already mounts something else at
// /opt/peregrine/il, or a pod with its own volume named peregrine-il, is skipped with a warning
// rather than given an invalid spec.
//
// The hostPath has type Directory: on a node where the CSI node plugin has not (yet) laid out the
// directory, the kubelet does not start the pod until it exists, the same dependency a Peregrine
// volume already has on the node plugin. Namespaces that enforce the Pod Security Standards'
// baseline or restricted level refuse hostPath volumes, and with them intercepted pods.
//
// # Failure policy
//
// The MutatingWebhookConfiguration (config/webhook) uses failurePolicy Ignore with timeoutSeconds 5,
// sideEffects None, reinvocationPolicy IfNeeded, leaves kube-system out with a namespaceSelector and
// sends only annotated pods to the webhook with a matchCondition. A webhook outage therefore never
// blocks a pod from being created; an annotated pod created during the outage runs without
// interception, which is a correctness-preserving degradation: its I/O takes the kernel FUSE path
// of its Peregrine volume, slower but with the same results. The matchCondition also keeps the
// 5-second timeout of an unreachable webhook off every pod that did not ask for interception.
//
// # Certificate
//
// CertRotator (certs.go) is a manager Runnable that runs on every operator replica (each one serves
// the webhook behind the Service). It keeps a self-signed CA and a serving certificate for
// <service>.<namespace>.svc (and .svc.cluster.local), ECDSA P-256, in a Secret (keys tls.crt,
// tls.key, ca.crt, and ca.key so that a new serving certificate can be signed by the same CA), which
// is the source of truth all replicas agree on: whoever finds it missing or due creates or updates
// it with optimistic concurrency, and a replica that loses the race re-reads it and takes what the
// winner wrote. Each replica writes the Secret's certificate and key into the webhook server's
// CertDir, where controller-runtime's certwatcher (fsnotify plus a 10-second re-read) makes the
// server present the new certificate without a restart, and sets the caBundle of the
// MutatingWebhookConfiguration.
//
// The serving certificate (default lifetime one year) is renewed when less than a third of its
// lifetime remains, or when it is missing, unparsable, not for the service's names or not signed by
// the current CA; it is re-issued by the same CA, so the caBundle does not change and a replica
// still serving the previous certificate stays trusted until it picks up the new one (at its next
// check, every hour by default). The CA (ten years) is renewed on the same one-third rule; the
// previous CA stays in the caBundle (ca.crt) until it expires, so the certificates it signed remain
// trusted while the replicas move over.
package webhook
