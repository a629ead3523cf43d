package consulroute

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// KVPrefix is where the applied copy of every service lives in Consul KV:
// KVPrefix + <namespace>/<service>.
const KVPrefix = "nomad-serverless/services/"

// Record is the applied copy of a service kept in Consul KV. It is the
// source of truth for what Publish wrote: Delete removes the config entries
// of exactly the revisions a record names.
type Record struct {
	Service spec.Service `json:"service"`
	// Latest is the newest ready revision; traffic targets marked latest
	// route to it.
	Latest string `json:"latest"`
	// Revisions are the revisions published: each not being deleted has
	// service-defaults and a resolver. Every revision the route names is
	// among them.
	Revisions []string `json:"revisions"`
	// Deleting are revisions on their way out (garbage collection), listed
	// in Revisions or not: Publish removes their config entries after the
	// router and splitter stop naming them, and refuses a route or latest
	// that names them. The caller drops them from Revisions and Deleting
	// once their Nomad job is purged; a crash in between leaves them here,
	// so the next run finishes the job.
	Deleting []string `json:"deleting,omitempty"`
	// Rollout is the service's latest rollout (rollout.go): while it is in
	// progress the route splits the latest share between its revisions.
	Rollout *RolloutRoute `json:"rollout,omitempty"`
	// UpdatedAt is when the record last changed. Publish ignores it when
	// deciding whether anything changed.
	UpdatedAt time.Time `json:"updated_at"`
}

// Route is the record's route, with latest resolved.
func (r Record) Route() (Route, error) {
	route, err := RouteFor(&r.Service, r.Latest)
	if err != nil {
		return Route{}, err
	}
	return applyRollout(route, r.Rollout, r.Latest, r.Service.LatestPercent()), nil
}

// Namespace is the record's namespace, spec.DefaultNamespace when empty.
func (r Record) Namespace() string { return namespaceOrDefault(r.Service.Namespace) }

// Key is the record's KV key.
func (r Record) Key() string { return RecordKey(r.Service.Namespace, r.Service.Name) }

// RecordKey is the KV key of a service's record.
func RecordKey(namespace, service string) string {
	return KVPrefix + namespaceOrDefault(namespace) + "/" + service
}

func namespaceOrDefault(ns string) string {
	if ns == "" {
		return spec.DefaultNamespace
	}
	return ns
}

// sameContent reports whether two records say the same thing, ignoring
// UpdatedAt: a Publish that changes nothing else writes nothing.
func (r Record) sameContent(o Record) bool {
	r.UpdatedAt, o.UpdatedAt = time.Time{}, time.Time{}
	a, err1 := json.Marshal(r)
	b, err2 := json.Marshal(o)
	return err1 == nil && err2 == nil && string(a) == string(b)
}

// validate checks what Consul cannot: that the route names only published
// revisions of this service and none being deleted. It runs before anything
// is written, so a refused publish changes nothing.
func (r Record) validate() (Route, error) {
	name := r.Service.Name
	if p := spec.ValidateName(name); p != nil {
		return Route{}, fmt.Errorf("%s", p.Error())
	}
	published := map[string]bool{}
	for _, rev := range r.Revisions {
		svc, _, ok := spec.ParseRevisionName(rev)
		if !ok || svc != name {
			return Route{}, fmt.Errorf("revision %q is not a revision of %s (want %s)", rev, name, spec.RevisionName(name, 1))
		}
		published[rev] = true
	}
	deleting := map[string]bool{}
	for _, rev := range r.Deleting {
		svc, _, ok := spec.ParseRevisionName(rev)
		if !ok || svc != name {
			return Route{}, fmt.Errorf("revision %q being deleted is not a revision of %s", rev, name)
		}
		deleting[rev] = true
	}
	if deleting[r.Latest] {
		return Route{}, fmt.Errorf("latest revision %s is being deleted", r.Latest)
	}
	if r.Latest != "" && !published[r.Latest] {
		return Route{}, fmt.Errorf("latest revision %s is not among the published revisions %v", r.Latest, r.Revisions)
	}
	route, err := r.Route()
	if err != nil {
		return Route{}, err
	}
	total := 0
	for _, s := range route.Splits {
		total += s.Percent
	}
	if total != 100 {
		return Route{}, fmt.Errorf("traffic of %s adds up to %d%%, not 100%%: fix the service's traffic blocks", name, total)
	}
	for _, rev := range route.Revisions() {
		if deleting[rev] {
			return Route{}, fmt.Errorf("the route of %s still names revision %s, which is being deleted", name, rev)
		}
		if !published[rev] {
			return Route{}, fmt.Errorf("the route of %s names revision %s, which is not published (known: %v)", name, rev, r.Revisions)
		}
	}
	return route, nil
}

func encodeRecord(r Record) ([]byte, error) {
	return json.Marshal(r)
}

// decodeRecord reads a record from its KV pair. The key names the service,
// so a value that omits the name or namespace still yields a usable record.
func decodeRecord(p *api.KVPair) (Record, error) {
	var r Record
	if err := json.Unmarshal(p.Value, &r); err != nil {
		return Record{}, fmt.Errorf("decode %s: %w", p.Key, err)
	}
	rest := strings.TrimPrefix(p.Key, KVPrefix)
	ns, name, ok := strings.Cut(rest, "/")
	if !ok || name == "" || strings.Contains(name, "/") {
		return Record{}, fmt.Errorf("key %s is not %s<namespace>/<service>", p.Key, KVPrefix)
	}
	if r.Service.Name == "" {
		r.Service.Name = name
	}
	if r.Service.Namespace == "" {
		r.Service.Namespace = ns
	}
	if r.Service.Name != name || namespaceOrDefault(r.Service.Namespace) != ns {
		return Record{}, fmt.Errorf("key %s holds service %s/%s", p.Key, r.Service.Namespace, r.Service.Name)
	}
	return r, nil
}

// ReadRecord reads a service's record and its ModifyIndex (the token for a
// later Publish's check-and-set). It returns ErrNotFound when absent.
func (c *Client) ReadRecord(ctx context.Context, namespace, service string) (Record, uint64, error) {
	key := RecordKey(namespace, service)
	op := fmt.Sprintf("read the record of %s/%s", namespaceOrDefault(namespace), service)
	p, _, err := c.api.KV().Get(key, c.q(ctx))
	if err != nil {
		return Record{}, 0, c.wrap(op, err)
	}
	if p == nil {
		return Record{}, 0, fmt.Errorf("%s: no key %s: %w", op, key, ErrNotFound)
	}
	r, err := decodeRecord(p)
	if err != nil {
		return Record{}, 0, fmt.Errorf("%s: %w", op, err)
	}
	return r, p.ModifyIndex, nil
}

// Records lists every service's record (for `list`), sorted by namespace
// and name.
func (c *Client) Records(ctx context.Context) ([]Record, error) {
	recs, _, err := c.listRecords(ctx, c.q(ctx))
	return recs, err
}

// sortRecords sorts records by namespace, then name.
func sortRecords(out []Record) {
	sort.Slice(out, func(i, j int) bool {
		if a, b := out[i].Namespace(), out[j].Namespace(); a != b {
			return a < b
		}
		return out[i].Service.Name < out[j].Service.Name
	})
}

func (c *Client) listRecords(ctx context.Context, q *api.QueryOptions) ([]Record, uint64, error) {
	pairs, meta, err := c.api.KV().List(KVPrefix, q)
	if err != nil {
		return nil, 0, c.wrap("list services under "+KVPrefix, err)
	}
	out := make([]Record, 0, len(pairs))
	for _, p := range pairs {
		r, err := decodeRecord(p)
		if err != nil {
			// One unreadable key must not hide every other service.
			c.log.WarnContext(ctx, "skipping unreadable service record", "key", p.Key, "err", err)
			continue
		}
		out = append(out, r)
	}
	sortRecords(out)
	var idx uint64
	if meta != nil {
		idx = meta.LastIndex
	}
	return out, idx, nil
}
