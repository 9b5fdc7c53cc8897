package csi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// probeTimeout bounds one liveness probe.
const probeTimeout = 10 * time.Second

// ServeHealth serves GET /healthz on addr (what the livenessprobe sidecar offers, without the
// sidecar): 200 "ok" when probe succeeds, 500 with the error's text when it fails. A nil probe
// always succeeds. It returns nil once ctx ends.
func ServeHealth(ctx context.Context, addr string, probe func(context.Context) error) error {
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		var err error
		if probe != nil {
			pctx, cancel := context.WithTimeout(r.Context(), probeTimeout)
			err = probe(pctx)
			cancel()
		}
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprintln(w, err.Error())
			return
		}
		fmt.Fprintln(w, "ok")
	})
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("health endpoint: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		<-served
		return nil
	case err := <-served:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return fmt.Errorf("health endpoint: %w", err)
	}
}
