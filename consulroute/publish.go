package consulroute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/hashicorp/consul/api"
)

// Publish makes Consul route a service as its record says, then stores the
// record in KV.
//
// Order (each step only names things the steps before it made, so no route
// ever points at a missing target, and Consul's own checks pass):
//  1. service-defaults protocol http for the service, each revision and the
//     activator (Consul refuses a splitter or router on a non-http service);
//  2. a resolver per revision failing over to the activator;
//  3. the router for tags (deleted instead when the route has no tags);
//  4. the splitter;
//  5. for revisions being deleted: their resolver, then their defaults;
//  6. the record in KV with check-and-set on casIndex (0 = create only).
//
// Idempotent: entries are compared with what Consul holds and only changed
// ones are written; a record equal to the stored one (UpdatedAt aside) is
// not rewritten. casIndex is checked before anything is written, so a stale
// deploy changes nothing; if a concurrent deploy wins the final
// check-and-set in between, Publish puts back the winner's entries and
// returns ErrConflict.
func (c *Client) Publish(ctx context.Context, rec Record, casIndex uint64) error {
	op := fmt.Sprintf("publish %s/%s", rec.Namespace(), rec.Service.Name)
	route, err := rec.validate()
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	key := rec.Key()

	cur, _, err := c.api.KV().Get(key, c.q(ctx))
	if err != nil {
		return c.wrap(op+": read "+key, err)
	}
	switch {
	case casIndex == 0 && cur != nil:
		return fmt.Errorf("%s: the service is already published (index %d); read it and publish again with that index: %w", op, cur.ModifyIndex, ErrConflict)
	case casIndex != 0 && cur == nil:
		return fmt.Errorf("%s: the service was deleted meanwhile: %w", op, ErrConflict)
	case casIndex != 0 && cur.ModifyIndex != casIndex:
		return fmt.Errorf("%s: the service changed meanwhile (index %d, expected %d): %w", op, cur.ModifyIndex, casIndex, ErrConflict)
	}

	if err := c.applyEntries(ctx, desiredEntries(rec, route)); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}

	if cur != nil {
		if old, err := decodeRecord(cur); err == nil && old.sameContent(rec) {
			return nil
		}
	}
	if rec.UpdatedAt.IsZero() {
		rec.UpdatedAt = time.Now().UTC()
	}
	body, err := encodeRecord(rec)
	if err != nil {
		return fmt.Errorf("%s: encode record: %w", op, err)
	}
	ok, _, err := c.api.KV().CAS(&api.KVPair{Key: key, Value: body, ModifyIndex: casIndex}, c.w(ctx))
	if err != nil {
		return c.wrap(op+": write "+key, err)
	}
	if !ok {
		return c.restoreAfterConflict(ctx, op, rec.Service.Namespace, rec.Service.Name)
	}
	return nil
}

// restoreAfterConflict runs when our entries were written but a concurrent
// writer won the record: the winner's record is the truth, so its entries
// are written again over ours.
func (c *Client) restoreAfterConflict(ctx context.Context, op, namespace, service string) error {
	conflict := fmt.Errorf("%s: another deploy changed the service at the same time: %w", op, ErrConflict)
	winner, _, err := c.ReadRecord(ctx, namespace, service)
	if errors.Is(err, ErrNotFound) {
		return conflict
	}
	if err != nil {
		return errors.Join(conflict, fmt.Errorf("restore the winning deploy's route: %w", err))
	}
	route, err := winner.validate()
	if err == nil {
		err = c.applyEntries(ctx, desiredEntries(winner, route))
	}
	if err != nil {
		return errors.Join(conflict, fmt.Errorf("restore the winning deploy's route: %w", err))
	}
	return conflict
}

// applyEntries brings Consul's entries to set, writing only what differs,
// and logs what it changed ("set service-splitter hello") at debug level.
func (c *Client) applyEntries(ctx context.Context, set entrySet) error {
	have, err := c.readEntries(ctx, set)
	if err != nil {
		return err
	}
	var changed []string
	put := func(e api.ConfigEntry) error {
		if err := c.setEntry(ctx, e); err != nil {
			return err
		}
		changed = append(changed, "set "+e.GetKind()+" "+e.GetName())
		return nil
	}
	del := func(kind, name string) error {
		if err := c.deleteEntry(ctx, kind, name); err != nil {
			return err
		}
		changed = append(changed, "delete "+kind+" "+name)
		return nil
	}

	for _, want := range set.defaults {
		cur := have.defaults[want.Name]
		if cur != nil && cur.Protocol == want.Protocol {
			continue
		}
		if err := put(withProtocol(cur, want)); err != nil {
			return err
		}
	}
	for _, want := range set.resolvers {
		if cur, ok := have.resolvers[want.Name]; ok && sameEntry(cur, want) {
			continue
		}
		if err := put(want); err != nil {
			return err
		}
	}
	switch {
	case set.router == nil && have.router != nil:
		if err := del(api.ServiceRouter, set.service); err != nil {
			return err
		}
	case set.router != nil && (have.router == nil || !sameEntry(have.router, set.router)):
		if err := put(set.router); err != nil {
			return err
		}
	}
	if have.splitter == nil || !sameEntry(have.splitter, set.splitter) {
		if err := put(set.splitter); err != nil {
			return err
		}
	}
	for _, rev := range set.stale {
		if _, ok := have.resolvers[rev]; ok {
			if err := del(api.ServiceResolver, rev); err != nil {
				return err
			}
		}
	}
	for _, rev := range set.stale {
		if _, ok := have.defaults[rev]; ok {
			if err := del(api.ServiceDefaults, rev); err != nil {
				return err
			}
		}
	}
	if len(changed) > 0 {
		c.log.DebugContext(ctx, "consul route entries written", "service", set.service, "changes", changed)
	}
	return nil
}

// existingEntries is what Consul holds of the kinds Publish writes.
type existingEntries struct {
	defaults  map[string]*api.ServiceConfigEntry
	resolvers map[string]*api.ServiceResolverConfigEntry
	router    *api.ServiceRouterConfigEntry
	splitter  *api.ServiceSplitterConfigEntry
}

// readEntries reads the entries set names, one by one: the service-defaults
// of the service, its revisions (stale ones included) and the activator,
// each revision's resolver, the router and the splitter. It never lists a
// kind: a listing is every service's entries, so a deploy of N services
// would read O(N) entries per publish, O(N²) in all (issue 45: 1.16 MB of
// resolvers per publish at 2,700 services). What it costs now grows with
// the service's revisions only.
func (c *Client) readEntries(ctx context.Context, set entrySet) (existingEntries, error) {
	have := existingEntries{
		defaults:  map[string]*api.ServiceConfigEntry{},
		resolvers: map[string]*api.ServiceResolverConfigEntry{},
	}
	read := func(kind, name string) (api.ConfigEntry, error) {
		e, err := c.getEntry(ctx, kind, name)
		if errors.Is(err, ErrNotFound) {
			return nil, nil
		}
		return e, err
	}
	defaults := make([]string, 0, len(set.defaults)+len(set.stale))
	for _, d := range set.defaults {
		defaults = append(defaults, d.Name)
	}
	defaults = append(defaults, set.stale...)
	for _, name := range defaults {
		if _, done := have.defaults[name]; done {
			continue
		}
		e, err := read(api.ServiceDefaults, name)
		if err != nil {
			return have, err
		}
		if d, ok := e.(*api.ServiceConfigEntry); ok {
			have.defaults[name] = d
		}
	}
	resolvers := make([]string, 0, len(set.resolvers)+len(set.stale))
	for _, r := range set.resolvers {
		resolvers = append(resolvers, r.Name)
	}
	resolvers = append(resolvers, set.stale...)
	for _, name := range resolvers {
		e, err := read(api.ServiceResolver, name)
		if err != nil {
			return have, err
		}
		if r, ok := e.(*api.ServiceResolverConfigEntry); ok {
			have.resolvers[name] = r
		}
	}
	e, err := read(api.ServiceRouter, set.service)
	if err != nil {
		return have, err
	}
	if r, ok := e.(*api.ServiceRouterConfigEntry); ok {
		have.router = r
	}
	e, err = read(api.ServiceSplitter, set.service)
	if err != nil {
		return have, err
	}
	if s, ok := e.(*api.ServiceSplitterConfigEntry); ok {
		have.splitter = s
	}
	return have, nil
}

// getEntry reads one config entry; ErrNotFound when absent.
func (c *Client) getEntry(ctx context.Context, kind, name string) (api.ConfigEntry, error) {
	e, _, err := c.api.ConfigEntries().Get(kind, name, c.q(ctx))
	if err != nil {
		// A 404 wraps as an *Error that Is ErrNotFound.
		return nil, c.wrap("read "+kind+" "+name, err)
	}
	return e, nil
}

// setEntry writes one config entry, surfacing Consul's refusal in its own
// words with what it means (fixtures 038, 039).
func (c *Client) setEntry(ctx context.Context, e api.ConfigEntry) error {
	op := "write " + e.GetKind() + " " + e.GetName()
	ok, _, err := c.api.ConfigEntries().Set(e, c.w(ctx))
	if err != nil {
		return c.wrap(op, err)
	}
	if !ok {
		return fmt.Errorf("%s: Consul answered false (not applied)", op)
	}
	return nil
}

// deleteEntry deletes one config entry; deleting an absent entry is not an
// error (Consul answers 200 and, for safety, 404 is accepted too).
func (c *Client) deleteEntry(ctx context.Context, kind, name string) error {
	_, err := c.api.ConfigEntries().Delete(kind, name, c.w(ctx))
	if err != nil {
		err = c.wrap("delete "+kind+" "+name, err)
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	return nil
}

// Delete removes everything Publish wrote for a service, in the reverse
// order: the router (tag routes go first, plain traffic still flows through
// the splitter), the splitter, each revision's resolver, the revisions' and
// the service's service-defaults, and last the record (check-and-set on the
// index it read, so a concurrent deploy is not silently erased). The
// activator's service-defaults is shared by every service and stays. A
// Delete cut short leaves the record in place, so running it again finishes
// the job. ErrNotFound when there is no record.
func (c *Client) Delete(ctx context.Context, namespace, service string) error {
	op := fmt.Sprintf("delete %s/%s", namespaceOrDefault(namespace), service)
	rec, idx, err := c.ReadRecord(ctx, namespace, service)
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	revs := append(slices.Clone(rec.Revisions), rec.Deleting...)
	sort.Strings(revs)
	revs = slices.Compact(revs)

	steps := []struct{ kind, name string }{
		{api.ServiceRouter, service},
		{api.ServiceSplitter, service},
	}
	for _, rev := range revs {
		steps = append(steps, struct{ kind, name string }{api.ServiceResolver, rev})
	}
	for _, rev := range revs {
		steps = append(steps, struct{ kind, name string }{api.ServiceDefaults, rev})
	}
	steps = append(steps, struct{ kind, name string }{api.ServiceDefaults, service})
	for _, s := range steps {
		if err := c.deleteEntry(ctx, s.kind, s.name); err != nil {
			return fmt.Errorf("%s: %w", op, err)
		}
	}

	ok, _, err := c.api.KV().DeleteCAS(&api.KVPair{Key: RecordKey(namespace, service), ModifyIndex: idx}, c.w(ctx))
	if err != nil {
		return c.wrap(op+": delete the record", err)
	}
	if !ok {
		return fmt.Errorf("%s: the service was deployed again while it was being deleted; run delete again: %w", op, ErrConflict)
	}
	return nil
}

// ReadRoute reads a service's route from its splitter and router entries
// (what Consul routes by, which may differ from the record while a publish
// is in flight). Its Namespace is empty: config entries do not carry the
// service's namespace. ErrNotFound when neither exists.
func (c *Client) ReadRoute(ctx context.Context, service string) (Route, error) {
	op := "read the route of " + service
	sp, err := c.getEntry(ctx, api.ServiceSplitter, service)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Route{}, fmt.Errorf("%s: %w", op, err)
	}
	rt, err := c.getEntry(ctx, api.ServiceRouter, service)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return Route{}, fmt.Errorf("%s: %w", op, err)
	}
	splitter, _ := sp.(*api.ServiceSplitterConfigEntry)
	router, _ := rt.(*api.ServiceRouterConfigEntry)
	if splitter == nil && router == nil {
		return Route{}, fmt.Errorf("%s: no service-splitter or service-router named %s: %w", op, service, ErrNotFound)
	}
	return routeFromEntries(service, splitter, router), nil
}
