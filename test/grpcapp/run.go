package grpcapp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"time"
)

// stopGrace bounds a graceful stop: calls still running after it (a call
// told to sleep an hour) are cut off, as a Nomad kill_timeout would.
const stopGrace = 5 * time.Second

// Run serves the app as its environment says (getenv) until ctx ends, then
// stops gracefully. It writes one line to log once it listens.
func Run(ctx context.Context, getenv func(string) string, log io.Writer) error {
	port, err := strconv.Atoi(getenv(EnvPort))
	if err != nil || port <= 0 || port > 65535 {
		return fmt.Errorf("grpcapp: %s=%q: want a port number", EnvPort, getenv(EnvPort))
	}
	host := getenv(EnvHost)
	if host == "" {
		host = "127.0.0.1"
	}
	cfg := Config{Name: getenv(EnvName)}
	if cfg.Name == "" {
		cfg.Name = getenv("K_REVISION")
	}
	if path := getenv(EnvEvents); path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
		if err != nil {
			return fmt.Errorf("grpcapp: open events file: %w", err)
		}
		defer f.Close()
		cfg.Events = f
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return fmt.Errorf("grpcapp: listen: %w", err)
	}
	srv := NewServer(cfg)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	fmt.Fprintf(log, "grpcapp %s: serving gRPC (h2c) on %s\n", cfg.Name, ln.Addr())
	select {
	case err := <-done:
		return fmt.Errorf("grpcapp: serve: %w", err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() {
		srv.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(stopGrace):
		srv.Stop()
		<-stopped
	}
	if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("grpcapp: serve: %w", err)
	}
	return nil
}
