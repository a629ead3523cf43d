package fakecluster

import (
	"fmt"
	"io"
	"os"
	"sync"
	"testing"
	"time"
)

// Options tune a Cluster. The zero value behaves with real Nomad's and
// Consul's timings.
type Options struct {
	// CheckInterval, when above 0, replaces the interval of every HTTP
	// check.
	CheckInterval time.Duration
	// ShutdownDelay, when above 0, replaces every group's shutdown_delay;
	// below 0 it turns shutdown delays off.
	ShutdownDelay time.Duration
	// RescheduleDelay, when above 0, replaces the delay before a failed
	// allocation is replaced.
	RescheduleDelay time.Duration
	// HeartbeatInterval is how often an idle event stream gets a "{}"
	// heartbeat; default 10s, as Nomad.
	HeartbeatInterval time.Duration
	// DataDir holds the allocation directories; default a temporary
	// directory removed on Close.
	DataDir string
	// TaskOutput, when set, receives every task's stdout and stderr, each
	// line prefixed with "[job alloc task] ". They always go to
	// <DataDir>/alloc/<alloc ID>/alloc/logs/<task>.std{out,err}.0 too.
	TaskOutput io.Writer
}

// Cluster is a fake Nomad agent and a fake Consul agent on 127.0.0.1, wired
// together as a dev cluster is: Nomad runs allocations and registers their
// services in Consul.
type Cluster struct {
	Nomad  *Nomad
	Consul *Consul

	tempDir   string
	closeOnce sync.Once
}

// New starts a cluster. Call Close when done.
func New(opts Options) (*Cluster, error) {
	if opts.HeartbeatInterval <= 0 {
		opts.HeartbeatInterval = 10 * time.Second
	}
	c := &Cluster{}
	if opts.DataDir == "" {
		dir, err := os.MkdirTemp("", "fakecluster-")
		if err != nil {
			return nil, fmt.Errorf("fake cluster: data directory: %w", err)
		}
		opts.DataDir, c.tempDir = dir, dir
	}
	c.Consul = newConsul(opts)
	c.Nomad = newNomad(opts, c.Consul)
	for _, s := range []*server{c.Consul.srv, c.Nomad.srv} {
		if err := s.start("127.0.0.1:0"); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// Start starts a cluster for a test and closes it in t.Cleanup.
func Start(tb testing.TB, opts Options) *Cluster {
	tb.Helper()
	c, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Env is the environment that points Nomad and Consul clients at the
// cluster.
func (c *Cluster) Env() map[string]string {
	return map[string]string{"NOMAD_ADDR": c.Nomad.Addr(), "CONSUL_HTTP_ADDR": c.Consul.Addr()}
}

// Close stops serving, stops every allocation (without shutdown delays)
// and waits for every goroutine and process the cluster started. It is
// safe to call more than once.
func (c *Cluster) Close() {
	c.closeOnce.Do(func() {
		c.Nomad.close()
		c.Consul.close()
		if c.tempDir != "" {
			_ = os.RemoveAll(c.tempDir)
		}
	})
}
