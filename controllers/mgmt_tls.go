package controllers

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// AdminCerts issues the operator's own client certificate (role admin, name "operator") for each
// ServerSet's system, from the ServerSet's CA Secret, and keeps it in memory only: it is never
// written anywhere, and a restarted operator issues itself a new one. It is issued again when the
// CA Secret's trust bundle or signer changes (a rotation step) or two thirds of its validity are
// over.
type AdminCerts struct {
	// Reader reads the CA Secrets (the API reader: no cache of Secrets).
	Reader client.Reader
	// Lifetime of the operator's certificates (default 24 h: they are cheap to make again).
	Lifetime time.Duration

	mu    sync.Mutex
	cache map[types.NamespacedName]*adminCert
}

type adminCert struct {
	fingerprint string // of the CA Secret's bundle and signer
	system      string
	material    *pki.Material
	renewAt     time.Time
}

// Source is the operator's certificate for the system of ServerSet ss, read at each handshake.
func (a *AdminCerts) Source(ss types.NamespacedName, system string) pki.Source {
	return func() (*pki.Material, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return a.get(ctx, ss, system)
	}
}

func (a *AdminCerts) get(ctx context.Context, ss types.NamespacedName, system string) (*pki.Material, error) {
	key := types.NamespacedName{Namespace: ss.Namespace, Name: ss.Name + "-ca"}
	sec := &corev1.Secret{}
	if err := a.Reader.Get(ctx, key, sec); err != nil {
		return nil, fmt.Errorf("the operator's certificate for system %q: CA Secret %s: %w", system, key, err)
	}
	ca, err := parseCASecret(sec)
	if err != nil {
		return nil, fmt.Errorf("the operator's certificate for system %q: CA Secret %s: %w", system, key, err)
	}
	fp := pki.Fingerprint(ca.bundle...) + "/" + pki.Fingerprint(ca.signer.Cert)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if c, ok := a.cache[ss]; ok && c.fingerprint == fp && c.system == system && now.Before(c.renewAt) {
		return c.material, nil
	}
	life := a.Lifetime
	if life <= 0 {
		life = 24 * time.Hour
	}
	leaf, err := ca.signer.Issue(pki.Identity{System: system, Role: pki.RoleAdmin, Name: "operator"}, now, life)
	if err != nil {
		return nil, err
	}
	m, err := pki.MaterialFromPEM(ca.bundlePEM(), leaf.CertPEM, leaf.KeyPEM)
	if err != nil {
		return nil, err
	}
	if a.cache == nil {
		a.cache = map[types.NamespacedName]*adminCert{}
	}
	a.cache[ss] = &adminCert{fingerprint: fp, system: system, material: m, renewAt: pki.RenewAt(leaf.Cert)}
	return m, nil
}
