package controllers

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	storagev1 "github.com/peregrine-storage/peregrine/api/v1alpha1"
	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// The control plane's certificates (issue 20, point 1): a CA per ServerSet, one certificate per
// rank, and the CSI driver's. Secrets are read with the API reader, never through the manager's
// cache: a cache would list and watch every Secret of the cluster (and need the RBAC for it). A
// forged or deleted Secret is therefore seen at the next reconcile (status refresh), not at once.
// No delete verb: the Secrets of a ServerSet go with it (owner references); the CSI driver's,
// in the operator's namespace, stay for the next ServerSet of that name.
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get;create;update;patch

// Secret keys and annotations.
const (
	// nextCAKey holds, during a CA rotation, the key of the new CA while the old one still signs.
	nextCAKey = "next.key"
	// tlsGenerationKey (CA and leaf Secrets) counts mass reissues: a leaf of an older generation
	// is reissued. Renewals and CA switches raise it; a single replaced leaf keeps it.
	tlsGenerationKey = "storage.peregrine.dev/tls-generation"
	// caStageSinceKey (CA Secret): when the current CA rotation stage (or the CA) began.
	caStageSinceKey = "storage.peregrine.dev/ca-stage-since"
	// tlsHashKey (pod template): the CA bundle and generation the pods run with; a change rolls
	// the engines (they read their certificates at start).
	tlsHashKey = "storage.peregrine.dev/tls-hash"
	// tlsMountPath is the engine's tls_dir: its own rank's ca.crt, tls.crt and tls.key, copied by
	// the pod's init container. Not below /etc/peregrine: that is a read-only ConfigMap volume.
	tlsMountPath = "/etc/peregrine-tls"
	labelTLSRole = "storage.peregrine.dev/tls-role"
)

// Names of the CSI driver's Secrets in TLSOptions.CSINamespace (the chart mounts them).
const (
	CSIControllerSecret = "peregrine-csi-controller-tls"
	CSINodeSecret       = "peregrine-csi-node-tls"
	// CSINodeAdminSecret is the node plugin's own certificate when it needs role admin
	// (TLSOptions.CSINodeRole); its FUSE daemons keep CSINodeSecret's (client).
	CSINodeAdminSecret = "peregrine-csi-node-admin-tls"
)

// TLSOptions are the operator's settings of the control plane's certificates.
type TLSOptions struct {
	// CALifetime is the validity of a new CA; it is rotated two thirds in.
	CALifetime time.Duration
	// CertLifetime is the validity of a leaf certificate; all are renewed two thirds in.
	CertLifetime time.Duration
	// StageDwell is the least time between two steps of a CA rotation beyond the engines'
	// restart: mounted Secrets reach running pods (the CSI driver's) within the kubelet's sync
	// period, about a minute.
	StageDwell time.Duration
	// CSINamespace and CSIServerSet: the ServerSet whose system the CSI driver serves gets its
	// two certificates (CSIControllerSecret, role admin; CSINodeSecret, role client) in that
	// namespace. Empty: none.
	CSINamespace string
	CSIServerSet types.NamespacedName
	// CSINodeRole is the node plugin's own role: client (mounts only; the default) or admin,
	// which inline ephemeral volumes need (the node plugin creates and destroys their
	// containers): then CSINodeAdminSecret is issued too. The FUSE daemons are clients either way.
	CSINodeRole pki.Role
}

// Defaults of TLSOptions (and of the operator's flags).
const (
	DefaultCALifetime   = 5 * 365 * 24 * time.Hour
	DefaultCertLifetime = 90 * 24 * time.Hour
	DefaultStageDwell   = 3 * time.Minute
)

func (o TLSOptions) withDefaults() TLSOptions {
	if o.CALifetime <= 0 {
		o.CALifetime = DefaultCALifetime
	}
	if o.CertLifetime <= 0 {
		o.CertLifetime = DefaultCertLifetime
	}
	if o.StageDwell <= 0 {
		o.StageDwell = DefaultStageDwell
	}
	if o.CSINodeRole == "" {
		o.CSINodeRole = pki.RoleClient
	}
	return o
}

func caSecretName(ss *storagev1.ServerSet) string { return ss.Name + "-ca" }

func engineTLSSecretName(ss *storagev1.ServerSet, rank int32) string {
	return fmt.Sprintf("%s-%d-tls", ss.Name, rank)
}

// caState is what the CA Secret holds.
type caState struct {
	// bundle is every CA trusted (ca.crt), signer.Cert among them.
	bundle []*x509.Certificate
	signer *pki.CA
	// next is the key of a new CA in the bundle that does not sign yet (first rotation stage).
	next       *ecdsa.PrivateKey
	generation int64
	stageSince time.Time
	// sec is the Secret as last read or written (nil: none yet).
	sec *corev1.Secret
}

func (s *caState) bundlePEM() []byte { return pki.EncodeCerts(s.bundle...) }

// hash is what the engine pods run with: a change restarts them.
func (s *caState) hash() string {
	h := sha256.New()
	h.Write(s.bundlePEM())
	fmt.Fprintf(h, "generation %d", s.generation)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// parseCASecret reads a CA Secret; an error says why it cannot be used.
func parseCASecret(sec *corev1.Secret) (*caState, error) {
	bundle, err := pki.ParseCerts(sec.Data[pki.CAFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pki.CAFile, err)
	}
	key, err := pki.ParseKey(sec.Data[pki.CAKeyFile])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", pki.CAKeyFile, err)
	}
	signer, err := pki.Signer(bundle, key)
	if err != nil {
		return nil, err
	}
	s := &caState{bundle: bundle, signer: signer, generation: 1, sec: sec}
	if b, ok := sec.Data[nextCAKey]; ok {
		next, err := pki.ParseKey(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", nextCAKey, err)
		}
		if _, err := pki.Signer(bundle, next); err != nil {
			return nil, fmt.Errorf("%s: %w", nextCAKey, err)
		}
		s.next = next
	}
	if g, err := strconv.ParseInt(sec.Annotations[tlsGenerationKey], 10, 64); err == nil && g > 0 {
		s.generation = g
	}
	if t, err := time.Parse(time.RFC3339, sec.Annotations[caStageSinceKey]); err == nil {
		s.stageSince = t
	} else {
		s.stageSince = signer.Cert.NotBefore
	}
	return s, nil
}

// caStep is the next step of a CA's life.
type caStep int

const (
	caKeep caStep = iota
	// caTrustNew makes a new CA and adds it to every ca.crt; the old one still signs.
	caTrustNew
	// caSignNew lets the new CA sign and reissues every leaf (a new generation).
	caSignNew
	// caDropOld removes the old CA from every ca.crt.
	caDropOld
)

func (s caStep) String() string {
	return [...]string{"keep", "trust the new CA", "sign with the new CA", "drop the old CA"}[s]
}

// nextCAStep decides a CA rotation's next step. A rotation starts two thirds into the signing
// CA's validity; each following step waits until the engines run what the last one wrote
// (rolled: every pod restarted with the current Secrets) and dwell has passed (running pods that
// are not restarted, the CSI driver's, see their mounted Secrets change within a minute or so).
// The order keeps every pair of peers able to verify each other: a new CA is trusted everywhere
// before it signs anything, and an old one is trusted until nothing it signed is in use.
func nextCAStep(s *caState, now time.Time, rolled bool, dwell time.Duration) caStep {
	settled := rolled && !now.Before(s.stageSince.Add(dwell))
	switch {
	case s.next != nil:
		if settled {
			return caSignNew
		}
	case len(s.bundle) > 1:
		if settled {
			return caDropOld
		}
	case !now.Before(pki.RenewAt(s.signer.Cert)):
		return caTrustNew
	}
	return caKeep
}

// applyCAStep changes s by step (making the new CA for caTrustNew).
func applyCAStep(s *caState, step caStep, system string, now time.Time, lifetime time.Duration) error {
	switch step {
	case caTrustNew:
		ca, err := pki.NewCA(system, now, lifetime)
		if err != nil {
			return err
		}
		s.bundle = append(s.bundle, ca.Cert)
		s.next = ca.Key
	case caSignNew:
		signer, err := pki.Signer(s.bundle, s.next)
		if err != nil {
			return err
		}
		s.signer, s.next = signer, nil
		s.generation++
	case caDropOld:
		s.bundle = []*x509.Certificate{s.signer.Cert}
	default:
		return nil
	}
	s.stageSince = now
	return nil
}

// rotationStage describes a rotation under way ("" when none).
func (s *caState) rotationStage() string {
	switch {
	case s.next != nil:
		return "stage 1/3: the new CA is trusted by every certificate holder; the old one still signs"
	case len(s.bundle) > 1:
		return "stage 2/3: the new CA signs; the old one is still trusted until every engine runs a new certificate"
	}
	return ""
}

// pruneExpired drops expired CAs other than the signer from the bundle (nothing they signed can
// still be valid).
func (s *caState) pruneExpired(now time.Time) bool {
	kept := s.bundle[:0:0]
	for _, c := range s.bundle {
		if c.Equal(s.signer.Cert) || (s.next != nil && pki.SameKey(c.PublicKey, &s.next.PublicKey)) || now.Before(c.NotAfter) {
			kept = append(kept, c)
		}
	}
	changed := len(kept) != len(s.bundle)
	s.bundle = kept
	return changed
}

// tlsOutcome is what reconcileTLS did, for the pod template and the ControlPlaneTLS condition.
type tlsOutcome struct {
	hash   string
	reason storagev1.ConditionReason
	msg    string
}

// rolledOut reports whether every engine pod runs the template whose TLS hash is hash.
func rolledOut(sts *appsv1.StatefulSet, hash string) bool {
	if sts == nil || sts.Spec.Template.Annotations[tlsHashKey] != hash {
		return false
	}
	want := int32(1)
	if sts.Spec.Replicas != nil {
		want = *sts.Spec.Replicas
	}
	return sts.Status.ObservedGeneration >= sts.Generation && currentPartition(sts) == 0 &&
		sts.Status.UpdatedReplicas >= want && sts.Status.ReadyReplicas >= want
}

// reconcileTLS keeps the ServerSet's CA and the certificates of ranks 0..replicas-1 (and the CSI
// driver's, when the ServerSet is TLSOptions.CSIServerSet), and moves a CA rotation on.
func (r *ServerSetReconciler) reconcileTLS(ctx context.Context, ss *storagev1.ServerSet, replicas int32) (*tlsOutcome, error) {
	opts := r.TLS.withDefaults()
	now := r.now()
	system := systemName(ss)
	ca, err := r.ensureCA(ctx, ss, system, opts, now)
	if err != nil {
		return nil, err
	}

	// Renewal: all leaves at once (one roll of the engines) when one of them is due.
	leaves := make([]leafSpec, 0, replicas+2)
	for rank := int32(0); rank < replicas; rank++ {
		leaves = append(leaves, leafSpec{
			key: types.NamespacedName{Namespace: ss.Namespace, Name: engineTLSSecretName(ss, rank)},
			id:  pki.EngineIdentity(system, rank), owned: true,
		})
	}
	if opts.CSINamespace != "" && opts.CSIServerSet == (types.NamespacedName{Namespace: ss.Namespace, Name: ss.Name}) {
		leaves = append(leaves,
			leafSpec{key: types.NamespacedName{Namespace: opts.CSINamespace, Name: CSIControllerSecret},
				id: pki.Identity{System: system, Role: pki.RoleAdmin, Name: "csi-controller"}},
			leafSpec{key: types.NamespacedName{Namespace: opts.CSINamespace, Name: CSINodeSecret},
				id: pki.Identity{System: system, Role: pki.RoleClient, Name: "csi-node"}})
		if opts.CSINodeRole == pki.RoleAdmin {
			leaves = append(leaves, leafSpec{key: types.NamespacedName{Namespace: opts.CSINamespace, Name: CSINodeAdminSecret},
				id: pki.Identity{System: system, Role: pki.RoleAdmin, Name: "csi-node"}})
		}
	}
	existing := make([]*corev1.Secret, len(leaves))
	renew := false
	for i, l := range leaves {
		sec, err := r.getSecret(ctx, l.key)
		if err != nil {
			return nil, err
		}
		existing[i] = sec
		if sec != nil && leafGeneration(sec) == ca.generation {
			if p, _ := pki.CheckLeaf(sec.Data[pki.CertFile], sec.Data[pki.KeyFile], ca.signer.Cert, l.id, now); p == pki.LeafRenewalDue || p == pki.LeafExpired {
				renew = true
			}
		}
	}
	if renew {
		ca.generation++
		if err := r.writeCA(ctx, ss, ca); err != nil {
			return nil, err
		}
		r.Recorder.Eventf(ss, corev1.EventTypeNormal, string(storagev1.ReasonCertificatesRenewed),
			"renewing every certificate of system %s (two thirds of their validity are over): generation %d", system, ca.generation)
	}
	ranks := make([]map[string][]byte, 0, replicas)
	for i, l := range leaves {
		data, err := r.ensureLeaf(ctx, ss, ca, l, existing[i], opts, now)
		if err != nil {
			return nil, err
		}
		if l.id.Role == pki.RoleEngine {
			ranks = append(ranks, data)
		}
	}
	if err := r.ensureEngineBundle(ctx, ss, ca, ranks); err != nil {
		return nil, err
	}
	out := &tlsOutcome{hash: ca.hash(), reason: storagev1.ReasonCertificatesReady,
		msg: fmt.Sprintf("CA %s valid to %s; %d engine certificate(s), generation %d", pki.Fingerprint(ca.signer.Cert),
			ca.signer.Cert.NotAfter.UTC().Format(time.RFC3339), replicas, ca.generation)}
	if st := ca.rotationStage(); st != "" {
		out.reason, out.msg = storagev1.ReasonCARotating, "CA rotation "+st
	}
	return out, nil
}

// ensureCA reads the CA Secret, makes it when missing or unusable, and takes the next rotation
// step when one is due.
func (r *ServerSetReconciler) ensureCA(ctx context.Context, ss *storagev1.ServerSet, system string, opts TLSOptions, now time.Time) (*caState, error) {
	log := logf.FromContext(ctx)
	key := types.NamespacedName{Namespace: ss.Namespace, Name: caSecretName(ss)}
	sec, err := r.getSecret(ctx, key)
	if err != nil {
		return nil, err
	}
	var ca *caState
	if sec != nil {
		if ca, err = parseCASecret(sec); err != nil {
			// Unusable (edited, corrupt): a new CA; every leaf is then reissued (they no longer
			// verify) and the engines roll.
			r.Recorder.Eventf(ss, corev1.EventTypeWarning, string(storagev1.ReasonCertificateReplaced),
				"CA Secret %s is unusable (%v): making a new CA", key.Name, err)
			log.Info("CA Secret unusable; replacing it", "secret", key.Name, "error", err.Error())
			ca = nil
		}
	}
	if ca == nil {
		fresh, err := pki.NewCA(system, now, opts.CALifetime)
		if err != nil {
			return nil, err
		}
		ca = &caState{bundle: []*x509.Certificate{fresh.Cert}, signer: fresh, generation: 1, stageSince: now, sec: sec}
		if err := r.writeCA(ctx, ss, ca); err != nil {
			return nil, err
		}
		r.Recorder.Eventf(ss, corev1.EventTypeNormal, string(storagev1.ReasonCAIssued),
			"CA %s of system %s made, valid to %s (Secret %s)", pki.Fingerprint(fresh.Cert), system, fresh.Cert.NotAfter.UTC().Format(time.RFC3339), key.Name)
		return ca, nil
	}
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ss.Namespace, Name: ss.Name}, sts); err != nil {
		if !apierrors.IsNotFound(err) {
			return nil, err
		}
		sts = nil
	}
	changed := ca.pruneExpired(now)
	step := nextCAStep(ca, now, rolledOut(sts, ca.hash()), opts.StageDwell)
	if err := applyCAStep(ca, step, system, now, opts.CALifetime); err != nil {
		return nil, err
	}
	if step != caKeep || changed {
		if err := r.writeCA(ctx, ss, ca); err != nil {
			return nil, err
		}
	}
	if step != caKeep {
		msg := fmt.Sprintf("CA rotation of system %s: %s (CAs trusted: %s; signing: %s)", system, step, fingerprints(ca.bundle), pki.Fingerprint(ca.signer.Cert))
		r.Recorder.Event(ss, corev1.EventTypeNormal, string(storagev1.ReasonCARotating), msg)
		log.Info(msg)
	}
	return ca, nil
}

func fingerprints(certs []*x509.Certificate) string {
	out := make([]string, len(certs))
	for i, c := range certs {
		out[i] = pki.Fingerprint(c)
	}
	return strings.Join(out, ", ")
}

// writeCA creates or updates the CA Secret.
func (r *ServerSetReconciler) writeCA(ctx context.Context, ss *storagev1.ServerSet, ca *caState) error {
	keyPEM, err := ca.signer.KeyPEM()
	if err != nil {
		return err
	}
	data := map[string][]byte{pki.CAFile: ca.bundlePEM(), pki.CAKeyFile: keyPEM}
	if ca.next != nil {
		if data[nextCAKey], err = pki.EncodeKey(ca.next); err != nil {
			return err
		}
	}
	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: caSecretName(ss), Namespace: ss.Namespace, Labels: tlsLabels(ss, "ca"),
			Annotations: map[string]string{
				tlsGenerationKey: strconv.FormatInt(ca.generation, 10),
				caStageSinceKey:  ca.stageSince.UTC().Format(time.RFC3339),
			}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	written, err := r.writeSecret(ctx, ss, sec, ca.sec, true)
	if err != nil {
		return err
	}
	ca.sec = written
	return nil
}

func tlsLabels(ss *storagev1.ServerSet, role string) map[string]string {
	l := engineLabels(ss)
	l[labelTLSRole] = role
	return l
}

// leafSpec is one certificate the operator keeps in a Secret.
type leafSpec struct {
	key types.NamespacedName
	id  pki.Identity
	// owned: the Secret is in the ServerSet's namespace and goes with it.
	owned bool
}

func leafGeneration(sec *corev1.Secret) int64 {
	g, _ := strconv.ParseInt(sec.Annotations[tlsGenerationKey], 10, 64)
	return g
}

// ensureLeaf keeps one leaf Secret: kept as it is when its certificate is the CA's, for its
// identity, of the current generation and not due; its ca.crt brought to the current bundle;
// reissued otherwise (with a warning event when it was forged, for another identity, or broken).
func (r *ServerSetReconciler) ensureLeaf(ctx context.Context, ss *storagev1.ServerSet, ca *caState, l leafSpec, sec *corev1.Secret, opts TLSOptions, now time.Time) (map[string][]byte, error) {
	problem, detail := pki.LeafInvalid, "missing"
	if sec != nil {
		problem, detail = pki.CheckLeaf(sec.Data[pki.CertFile], sec.Data[pki.KeyFile], ca.signer.Cert, l.id, now)
		if problem == pki.LeafOK && leafGeneration(sec) != ca.generation {
			problem, detail = pki.LeafRenewalDue, fmt.Sprintf("generation %d, now %d", leafGeneration(sec), ca.generation)
		}
		if problem == pki.LeafOK && sec.Type != corev1.SecretTypeTLS {
			problem, detail = pki.LeafInvalid, fmt.Sprintf("type %s, want %s", sec.Type, corev1.SecretTypeTLS)
		}
	}
	labels := tlsLabels(ss, string(l.id.Role))
	if l.id.Role != pki.RoleEngine {
		labels = map[string]string{"app.kubernetes.io/managed-by": "peregrine-operator", labelTLSRole: string(l.id.Role),
			labelServerSet: ss.Name, "storage.peregrine.dev/serverset-namespace": ss.Namespace}
	}
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: l.key.Name, Namespace: l.key.Namespace, Labels: labels,
			Annotations: map[string]string{tlsGenerationKey: strconv.FormatInt(ca.generation, 10)}},
		Type: corev1.SecretTypeTLS,
	}
	if problem == pki.LeafOK {
		if bytes.Equal(sec.Data[pki.CAFile], ca.bundlePEM()) {
			return sec.Data, nil
		}
		want.Data = map[string][]byte{pki.CAFile: ca.bundlePEM(), pki.CertFile: sec.Data[pki.CertFile], pki.KeyFile: sec.Data[pki.KeyFile]}
		_, err := r.writeSecret(ctx, ss, want, sec, l.owned)
		return want.Data, err
	}
	leaf, err := ca.signer.Issue(l.id, now, opts.CertLifetime)
	if err != nil {
		return nil, err
	}
	want.Data = map[string][]byte{pki.CAFile: ca.bundlePEM(), pki.CertFile: leaf.CertPEM, pki.KeyFile: leaf.KeyPEM}
	if _, err := r.writeSecret(ctx, ss, want, sec, l.owned); err != nil {
		return nil, err
	}
	switch {
	case sec == nil:
		r.Recorder.Eventf(ss, corev1.EventTypeNormal, string(storagev1.ReasonCertificateIssued),
			"certificate for %s issued (Secret %s/%s, valid to %s)", l.id, l.key.Namespace, l.key.Name, leaf.Cert.NotAfter.UTC().Format(time.RFC3339))
	case problem == pki.LeafRenewalDue:
		// The mass renewal's event said it.
	default:
		r.Recorder.Eventf(ss, corev1.EventTypeWarning, string(storagev1.ReasonCertificateReplaced),
			"certificate in Secret %s/%s replaced: %s: %s", l.key.Namespace, l.key.Name, problem, detail)
		logf.FromContext(ctx).Info("replaced a certificate Secret", "secret", l.key.String(), "problem", string(problem), "detail", detail)
	}
	return want.Data, nil
}

// engineBundleSecretName is the Secret the engine pods mount: every rank's certificate in one,
// so that adding a rank changes its contents and not the pod template (a scale-up rolls nothing).
func engineBundleSecretName(ss *storagev1.ServerSet) string { return ss.Name + "-engine-tls" }

// ensureEngineBundle keeps NAME-engine-tls equal to the per-rank Secrets: ca.crt, and RANK.crt
// and RANK.key for each rank.
func (r *ServerSetReconciler) ensureEngineBundle(ctx context.Context, ss *storagev1.ServerSet, ca *caState, ranks []map[string][]byte) error {
	data := map[string][]byte{pki.CAFile: ca.bundlePEM()}
	for rank, d := range ranks {
		data[fmt.Sprintf("%d.crt", rank)] = d[pki.CertFile]
		data[fmt.Sprintf("%d.key", rank)] = d[pki.KeyFile]
	}
	key := types.NamespacedName{Namespace: ss.Namespace, Name: engineBundleSecretName(ss)}
	sec, err := r.getSecret(ctx, key)
	if err != nil {
		return err
	}
	if sec != nil && sec.Type == corev1.SecretTypeOpaque && len(sec.Data) == len(data) {
		same := true
		for k, v := range data {
			if !bytes.Equal(sec.Data[k], v) {
				same = false
				break
			}
		}
		if same {
			return nil
		}
	}
	want := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: key.Name, Namespace: key.Namespace, Labels: tlsLabels(ss, "engines"),
			Annotations: map[string]string{tlsGenerationKey: strconv.FormatInt(ca.generation, 10)}},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
	_, err = r.writeSecret(ctx, ss, want, sec, true)
	return err
}

// writeSecret creates want, or updates existing to it (data, type, labels, annotations), owned
// by ss when owned. A Secret of another type cannot change type: it is refused with an error
// naming it (the operator has no delete verb).
func (r *ServerSetReconciler) writeSecret(ctx context.Context, ss *storagev1.ServerSet, want, existing *corev1.Secret, owned bool) (*corev1.Secret, error) {
	if existing == nil {
		if owned {
			if err := controllerutil.SetControllerReference(ss, want, r.Scheme); err != nil {
				return nil, err
			}
		}
		if err := r.Create(ctx, want); err != nil {
			return nil, fmt.Errorf("serverset %s: create Secret %s/%s: %w", ss.Name, want.Namespace, want.Name, err)
		}
		return want, nil
	}
	if existing.Type != want.Type {
		return nil, fmt.Errorf("serverset %s: Secret %s/%s has type %s, want %s: delete it and the operator makes it again",
			ss.Name, existing.Namespace, existing.Name, existing.Type, want.Type)
	}
	upd := existing.DeepCopy()
	upd.Data = want.Data
	upd.StringData = nil
	if upd.Labels == nil {
		upd.Labels = map[string]string{}
	}
	for k, v := range want.Labels {
		upd.Labels[k] = v
	}
	if upd.Annotations == nil {
		upd.Annotations = map[string]string{}
	}
	for k, v := range want.Annotations {
		upd.Annotations[k] = v
	}
	if owned {
		if err := controllerutil.SetControllerReference(ss, upd, r.Scheme); err != nil {
			return nil, fmt.Errorf("serverset %s: Secret %s/%s: %w", ss.Name, existing.Namespace, existing.Name, err)
		}
	}
	if err := r.Update(ctx, upd); err != nil {
		return nil, fmt.Errorf("serverset %s: update Secret %s/%s: %w", ss.Name, upd.Namespace, upd.Name, err)
	}
	return upd, nil
}

// getSecret reads a Secret from the API server (nil when there is none).
func (r *ServerSetReconciler) getSecret(ctx context.Context, key types.NamespacedName) (*corev1.Secret, error) {
	sec := &corev1.Secret{}
	if err := r.secretReader().Get(ctx, key, sec); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		return nil, fmt.Errorf("Secret %s: %w", key, err)
	}
	return sec, nil
}

func (r *ServerSetReconciler) secretReader() client.Reader {
	if r.APIReader != nil {
		return r.APIReader
	}
	return r.Client
}

func (r *ServerSetReconciler) now() time.Time {
	if r.Now != nil {
		return r.Now()
	}
	return time.Now()
}

func (o *tlsOutcome) status() metav1.ConditionStatus {
	if o.hash == "" {
		return metav1.ConditionFalse
	}
	return metav1.ConditionTrue
}

// controlPlaneTLS keeps the certificates of a ServerSet with TLS, or says that it has none.
func (r *ServerSetReconciler) controlPlaneTLS(ctx context.Context, ss *storagev1.ServerSet) (*tlsOutcome, error) {
	if ss.Spec.InsecureControlPlane {
		// The policy allowed it (--allow-insecure-control-plane); the condition's change is a
		// Warning event, and the operator logs it.
		logf.FromContext(ctx).Info("WARNING: the ServerSet's engines serve their control plane without TLS (spec.insecureControlPlane)")
		return &tlsOutcome{reason: storagev1.ReasonInsecureControlPlane,
			msg: "spec.insecureControlPlane: the engines' gRPC API has no TLS; anyone who reaches a control port may administer the system or join it as any rank"}, nil
	}
	replicas := ss.Spec.Engines
	sts := &appsv1.StatefulSet{}
	if err := r.Get(ctx, client.ObjectKey{Namespace: ss.Namespace, Name: ss.Name}, sts); err == nil {
		if sts.Spec.Replicas != nil && *sts.Spec.Replicas > replicas {
			replicas = *sts.Spec.Replicas // scaling down is refused: those ranks keep running
		}
	} else if !apierrors.IsNotFound(err) {
		return nil, err
	}
	return r.reconcileTLS(ctx, ss, replicas)
}
