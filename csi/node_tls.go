package csi

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/peregrine-storage/peregrine/pkg/pki"
)

// The FUSE daemons outlive the plugin's container (restart-safe volumes), and with it the mount of
// the plugin's certificate Secret: a daemon started by a plugin pod that has since been replaced
// would keep reading a directory nobody updates. So the daemons read a copy in the state directory
// (a hostPath that stays), which every plugin keeps up to date (syncTLS).

// tlsCopyDir is where the daemons read the node plugin's certificate.
func (ns *NodeServer) tlsCopyDir() string { return filepath.Join(ns.cfg.StateDir, "tls") }

// securityArgs are peregrine-fuse's flags for the control plane.
func (ns *NodeServer) securityArgs() []string {
	switch {
	case ns.cfg.Insecure && !ns.fuseTLS:
		return nil // a daemon without TLS support is insecure anyway, and refuses the flag
	case ns.cfg.Insecure:
		return []string{"--insecure"}
	case ns.fuseTLSDir() != "":
		return []string{"--tls-dir", ns.tlsCopyDir()}
	}
	return nil
}

// fuseTLSDir is the daemons' certificate directory (FuseTLSDir, else TLSDir).
func (ns *NodeServer) fuseTLSDir() string {
	if ns.cfg.FuseTLSDir != "" {
		return ns.cfg.FuseTLSDir
	}
	return ns.cfg.TLSDir
}

// syncTLS copies ca.crt, tls.crt and tls.key from fuseTLSDir into the state directory when they
// changed, each file replaced atomically (a daemon reading them never sees half a file). The key
// file is written last: a reader that sees the new key finds the new certificate with it.
func (ns *NodeServer) syncTLS() error {
	src := ns.fuseTLSDir()
	if src == "" {
		return nil
	}
	if _, err := pki.LoadDir(src); err != nil {
		return err // half-updated or missing: keep the last good copy
	}
	dst := ns.tlsCopyDir()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return err
	}
	for _, f := range []string{pki.CAFile, pki.CertFile, pki.KeyFile} {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			return err
		}
		if old, err := os.ReadFile(filepath.Join(dst, f)); err == nil && string(old) == string(b) {
			continue
		}
		tmp := filepath.Join(dst, "."+f+".tmp")
		if err := os.WriteFile(tmp, b, 0o600); err != nil {
			return err
		}
		if err := os.Rename(tmp, filepath.Join(dst, f)); err != nil {
			return err
		}
		slog.Info("csi node: certificate copy updated for the FUSE daemons", "file", filepath.Join(dst, f))
	}
	return nil
}

// keepTLS refreshes the copy every interval until ctx ends (the kubelet updates the mounted
// Secret in place after a renewal or a CA rotation step).
func (ns *NodeServer) keepTLS(ctx context.Context, interval time.Duration) {
	if ns.fuseTLSDir() == "" {
		return
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := ns.syncTLS(); err != nil {
				slog.Warn("csi node: cannot refresh the FUSE daemons' certificate copy", "error", err)
			}
		}
	}
}

// checkTLS checks that the FUSE daemon can do what is asked and makes the first copy of the
// certificate; without it no volume could be mounted.
func (ns *NodeServer) checkTLS() error {
	if ns.fuseTLSDir() != "" && ns.cfg.Insecure {
		return fmt.Errorf("csi node: a TLS directory and insecure exclude each other")
	}
	// A daemon built before TLS on the control plane has neither flag (the binary names its
	// flags): it may serve an insecure setup, never a TLS one.
	b, err := os.ReadFile(ns.cfg.FuseBin)
	if err != nil {
		return fmt.Errorf("csi node: FUSE daemon binary: %w", err)
	}
	ns.fuseTLS = bytes.Contains(b, []byte("tls-dir"))
	if ns.fuseTLSDir() != "" && !ns.fuseTLS {
		return fmt.Errorf("csi node: %s has no TLS on the control plane (no --tls-dir): use a newer image, or --insecure-control-plane", ns.cfg.FuseBin)
	}
	if err := ns.syncTLS(); err != nil {
		slog.Warn("csi node: no certificate for the FUSE daemons yet; mounts fail until there is", "dir", ns.fuseTLSDir(), "error", err)
	}
	return nil
}
