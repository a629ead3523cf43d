package nomadjob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// ACL capabilities each operation needs, named in permission errors.
const (
	capSubmit = "submit-job"
	capRead   = "read-job"
	capList   = "list-jobs"
	capScale  = "scale-job"
)

// Client is a thin adapter over Nomad's API client for revision jobs. It is
// safe for concurrent use.
//
// Methods that take a revision name find its namespace from the jobs the
// client has seen (registered, listed, read or streamed); a revision it has
// not seen is looked for in the client's namespace (NOMAD_NAMESPACE, else
// "default"). Revision names are unique across namespaces by convention
// (the catalog keys them by name alone).
type Client struct {
	api       *api.Client
	addr      string
	creds     Credentials
	namespace string
	log       *slog.Logger

	// unboundedMax is the scaling block's max for an unbounded service
	// (UpdateScaling); conflictRetries bounds UpdateScaling's re-reads.
	unboundedMax    int
	conflictRetries int
	// now stamps JobMetaCreated.
	now func() time.Time

	mu         sync.Mutex
	namespaces map[string]string // revision -> namespace
}

// NewClient returns a client for cfg; pass api.DefaultConfig() to honour
// NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, NOMAD_REGION and the TLS
// variables as the nomad CLI does.
func NewClient(cfg *api.Config) (*Client, error) {
	if cfg == nil {
		cfg = api.DefaultConfig()
	}
	// The API client turns unix://path into http://127.0.0.1 with a
	// unix dialer: errors name the socket the user set, not that.
	addr := cfg.Address
	c, err := api.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("nomad client for %s: %w", cfg.Address, err)
	}
	if !strings.HasPrefix(addr, "unix://") {
		addr = c.Address()
	}
	ns := cfg.Namespace
	if ns == "" {
		ns = spec.DefaultNamespace
	}
	caCert := ""
	if cfg.TLSConfig != nil {
		caCert = cmp.Or(cfg.TLSConfig.CACert, cfg.TLSConfig.CAPath)
	}
	return &Client{
		api:             c,
		addr:            addr,
		creds:           Credentials{TokenSet: cfg.SecretID != "", CACert: caCert},
		namespace:       ns,
		log:             slog.Default(),
		unboundedMax:    UnboundedMax,
		conflictRetries: 5,
		now:             time.Now,
		namespaces:      map[string]string{},
	}, nil
}

// SetLogger sets where the client logs (reconnects of the event stream);
// slog.Default() unless set.
func (c *Client) SetLogger(l *slog.Logger) {
	if l != nil {
		c.log = l
	}
}

// SetPolicy names the ACL policy (as install renders it) that the token of
// this client's user should hold, for the hint of a permission error.
func (c *Client) SetPolicy(name string) { c.creds.Policy = name }

// SetUnboundedMax sets the scaling block's max UpdateScaling writes for a
// service whose max is 0; it must match Options.UnboundedMax of Compile.
func (c *Client) SetUnboundedMax(n int) {
	if n > 0 {
		c.unboundedMax = n
	}
}

// Address is the Nomad address the client talks to.
func (c *Client) Address() string { return c.addr }

// API is the underlying Nomad client, for what this adapter does not cover.
func (c *Client) API() *api.Client { return c.api }

func (c *Client) remember(revision, namespace string) {
	if revision == "" || namespace == "" {
		return
	}
	c.mu.Lock()
	c.namespaces[revision] = namespace
	c.mu.Unlock()
}

func (c *Client) forget(revision string) {
	c.mu.Lock()
	delete(c.namespaces, revision)
	c.mu.Unlock()
}

// namespaceOf is the namespace a revision's requests go to.
func (c *Client) namespaceOf(revision string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns, ok := c.namespaces[revision]; ok {
		return ns
	}
	return c.namespace
}

func (c *Client) query(ctx context.Context, ns string) *api.QueryOptions {
	return (&api.QueryOptions{Namespace: ns}).WithContext(ctx)
}

func (c *Client) write(ctx context.Context, ns string) *api.WriteOptions {
	return (&api.WriteOptions{Namespace: ns}).WithContext(ctx)
}

func (c *Client) wrap(op, ns, capability string, err error) error {
	werr := wrap(op, c.addr, ns, capability, c.creds, err)
	var e *Error
	if errors.As(werr, &e) && e.Kind == ErrPermission && c.creds.TokenSet {
		e.Credentials.TokenRejected = c.tokenRejected()
	}
	return werr
}

// tokenRejected asks Nomad for the client's own token, which any token
// that Nomad accepts may read, and returns what Nomad said if it refused:
// the token itself is expired, deleted or from another cluster, not short
// of a capability. It is asked only after a 403, to word the error.
func (c *Client) tokenRejected() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := c.api.ACLTokens().Self((&api.QueryOptions{}).WithContext(ctx))
	var ue api.UnexpectedResponseError
	if !errors.As(err, &ue) || !ue.HasStatusCode() {
		return ""
	}
	body := strings.TrimSpace(ue.Body())
	switch {
	case strings.Contains(strings.ToLower(body), "token"):
		return body
	case ue.StatusCode() == http.StatusForbidden || ue.StatusCode() == http.StatusNotFound:
		return cmp.Or(body, http.StatusText(ue.StatusCode()))
	}
	return "" // Nomad failed otherwise (no leader...): say nothing of the token
}

// Register submits a revision job. enforceIndex is the JobModifyIndex the
// job must still have (0: the job must not exist yet); if it changed,
// Register fails with ErrConflict and the caller re-reads and retries.
// On first registration (enforceIndex 0) it stamps JobMetaCreated. It
// returns the evaluation ID.
func (c *Client) Register(ctx context.Context, job *api.Job, enforceIndex uint64) (string, error) {
	if job == nil || job.ID == nil {
		return "", errors.New("register revision: the job has no ID")
	}
	name := *job.ID
	ns := deref(job.Namespace, c.namespace)
	op := "register revision " + name
	if enforceIndex == 0 {
		if _, ok := job.Meta[JobMetaCreated]; !ok {
			cp := *job
			cp.Meta = maps.Clone(job.Meta)
			if cp.Meta == nil {
				cp.Meta = map[string]string{}
			}
			cp.Meta[JobMetaCreated] = c.now().UTC().Format(time.RFC3339)
			job = &cp
		}
	}
	resp, _, err := c.api.Jobs().RegisterOpts(job, &api.RegisterOptions{EnforceIndex: true, ModifyIndex: enforceIndex}, c.write(ctx, ns))
	if err != nil {
		return "", c.wrap(op, ns, capSubmit, err)
	}
	c.remember(name, ns)
	return resp.EvalID, nil
}

// Job reads a revision's job.
func (c *Client) Job(ctx context.Context, revision string) (*api.Job, error) {
	ns := c.namespaceOf(revision)
	job, _, err := c.api.Jobs().Info(revision, c.query(ctx, ns))
	if err != nil {
		return nil, c.wrap("read revision "+revision, ns, capRead, err)
	}
	c.remember(revision, deref(job.Namespace, ns))
	return job, nil
}

// Revision reads a revision's job and what it says about the revision.
func (c *Client) Revision(ctx context.Context, revision string) (RevisionInfo, error) {
	job, err := c.Job(ctx, revision)
	if err != nil {
		return RevisionInfo{}, err
	}
	return RevisionFromJob(job)
}

// Stop stops a revision's job without purging it (nomad job stop): its
// allocations stop (after the group's shutdown delay) and the job stays,
// dead, with its allocations and their events for inspection. A stopped
// revision is no longer planned on, scaled or routed; Purge removes it.
func (c *Client) Stop(ctx context.Context, revision string) error {
	ns := c.namespaceOf(revision)
	if _, _, err := c.api.Jobs().Deregister(revision, false, c.write(ctx, ns)); err != nil {
		return c.wrap("stop revision "+revision, ns, capSubmit, err)
	}
	return nil
}

// Purge deletes a revision's job for good (nomad job stop -purge): its
// allocations stop (after the group's shutdown delay) and the job is gone.
func (c *Client) Purge(ctx context.Context, revision string) error {
	ns := c.namespaceOf(revision)
	if _, _, err := c.api.Jobs().Deregister(revision, true, c.write(ctx, ns)); err != nil {
		return c.wrap("purge revision "+revision, ns, capSubmit, err)
	}
	c.forget(revision)
	return nil
}
