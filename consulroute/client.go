package consulroute

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// Client talks to one Consul agent for nomad-serverless: route config
// entries, the KV copy of each service, ready instances, the activator's
// registrations and the leader lock. It is safe for concurrent use and holds
// no mutable state of its own beyond the underlying HTTP client.
type Client struct {
	api *api.Client
	// cfg is the configuration api was made from: a client of another
	// agent (AgentOf) is made from it with that agent's address.
	cfg     api.Config
	addr    string // scheme://address, for error messages
	replica string
	log     *slog.Logger
	// tokenSet, caCert and policy are what errors name: whether a token
	// was sent (CONSUL_HTTP_TOKEN), the CA file (CONSUL_CACERT), and the
	// ACL policy the token should hold (WithPolicy).
	tokenSet bool
	caCert   string
	policy   string

	// wait bounds one blocking query; backoffMin/Max space retries after a
	// failed one.
	wait       time.Duration
	backoffMin time.Duration
	backoffMax time.Duration
}

// Option changes a Client at construction.
type Option func(*Client) error

// WithReplica names this control-plane replica. It makes the activator's and
// the stand-in instances' service IDs unique per replica. Default: the host
// name.
func WithReplica(id string) Option {
	return func(c *Client) error {
		if id == "" {
			return errors.New("replica id is empty")
		}
		c.replica = id
		return nil
	}
}

// WithLogger sets where retries of watches and locks are logged. Default:
// slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *Client) error {
		if l == nil {
			return errors.New("logger is nil")
		}
		c.log = l
		return nil
	}
}

// WithPolicy names the ACL policy (as install renders it) that this
// client's token should hold, for the hint of a permission error:
// nomad-serverless-deploy for the CLI, nomad-serverless-control-plane for
// serve.
func WithPolicy(name string) Option {
	return func(c *Client) error {
		c.policy = name
		return nil
	}
}

// WithWaitTime bounds one blocking query (Consul caps it at 10 minutes).
// Default 5 minutes.
func WithWaitTime(d time.Duration) Option {
	return func(c *Client) error {
		if d <= 0 || d > 10*time.Minute {
			return fmt.Errorf("blocking wait %s is outside (0, 10m]", d)
		}
		c.wait = d
		return nil
	}
}

// WithBackoff sets how long watches and the lock wait after a failed call:
// min after the first failure, doubling up to max. Default 250ms..10s.
func WithBackoff(min, max time.Duration) Option {
	return func(c *Client) error {
		if min <= 0 || max < min {
			return fmt.Errorf("backoff %s..%s: need 0 < min <= max", min, max)
		}
		c.backoffMin, c.backoffMax = min, max
		return nil
	}
}

// NewClient makes a Client from a Consul API configuration. Callers pass
// api.DefaultConfig(), which reads CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and
// the TLS variables the same way the consul CLI does; nil means exactly that.
func NewClient(cfg *api.Config, opts ...Option) (*Client, error) {
	if cfg == nil {
		cfg = api.DefaultConfig()
	}
	// As given: api.NewClient rewrites cfg (the scheme cut off the
	// address, an HTTP client dialing a unix socket).
	orig := *cfg
	a, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("consul client for %s: %w (check CONSUL_HTTP_ADDR and the TLS variables CONSUL_CACERT, CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY)", cfg.Address, err)
	}
	host, _ := os.Hostname()
	if host == "" {
		host = "replica"
	}
	c := &Client{
		api:        a,
		cfg:        orig,
		addr:       displayAddr(cfg),
		tokenSet:   cfg.Token != "" || cfg.TokenFile != "",
		caCert:     cmp.Or(cfg.TLSConfig.CAFile, cfg.TLSConfig.CAPath),
		replica:    host,
		log:        slog.Default(),
		wait:       5 * time.Minute,
		backoffMin: 250 * time.Millisecond,
		backoffMax: 10 * time.Second,
	}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, fmt.Errorf("consul client: %w", err)
		}
	}
	return c, nil
}

// API is the underlying Consul client, for callers that need an endpoint
// this package does not wrap.
func (c *Client) API() *api.Client { return c.api }

// Addr is the Consul address this client talks to, as shown in errors.
func (c *Client) Addr() string { return c.addr }

// Replica is this replica's id (see WithReplica).
func (c *Client) Replica() string { return c.replica }

func displayAddr(cfg *api.Config) string {
	addr := cfg.Address
	if addr == "" {
		addr = "127.0.0.1:8500"
	}
	if cfg.Scheme != "" && !strings.Contains(addr, "://") {
		return cfg.Scheme + "://" + addr
	}
	return addr
}

func (c *Client) q(ctx context.Context) *api.QueryOptions {
	return (&api.QueryOptions{}).WithContext(ctx)
}

// blocking is the options of a blocking query waiting on index (0: answer
// at once) for at most the client's wait time.
func (c *Client) blocking(ctx context.Context, index uint64) *api.QueryOptions {
	return (&api.QueryOptions{WaitIndex: index, WaitTime: c.wait}).WithContext(ctx)
}

func (c *Client) w(ctx context.Context) *api.WriteOptions {
	return (&api.WriteOptions{}).WithContext(ctx)
}

// backoff is the wait before retry number n (0-based).
func (c *Client) backoff(n int) time.Duration {
	d := c.backoffMin
	for i := 0; i < n && d < c.backoffMax; i++ {
		d *= 2
	}
	return min(d, c.backoffMax)
}

// sleep waits d or until ctx ends; it reports whether ctx is still live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
