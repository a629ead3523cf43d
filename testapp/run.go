package testapp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"
)

// Run waits cfg.StartDelay, listens on cfg.Host:cfg.Port (HTTP/1.1 and h2c
// with prior knowledge) and serves until ctx ends, then shuts down, giving
// requests in flight up to cfg.StopGrace.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.StartDelay > 0 {
		log.Info("testapp: waiting before listening", "start_delay", cfg.StartDelay)
		t := time.NewTimer(cfg.StartDelay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil
		}
	}
	addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("testapp: listen on %s: %w", addr, err)
	}
	app := New(cfg)
	var h http.Handler = app
	if cfg.Tracing != nil {
		h = traced(cfg.Tracing, app)
	}
	srv := NewServer(h)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	log.Info("testapp: listening", "addr", ln.Addr().String(), "ready_delay", cfg.ReadyDelay)

	select {
	case err := <-errc:
		return fmt.Errorf("testapp: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.StopGrace)
	defer cancel()
	err = srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		_ = srv.Close()
	}
	st := app.Stats()
	log.Info("testapp: stopped", "requests", st.Requests, "max_concurrency", st.MaxConcurrency)
	return nil
}

// NewServer returns an http.Server for h that speaks HTTP/1.1 and h2c (HTTP/2
// with prior knowledge), as a user's app behind the sidecar may.
func NewServer(h http.Handler) *http.Server {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return &http.Server{
		Handler:           h,
		Protocols:         &p,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
	}
}
