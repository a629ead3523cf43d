package rollout

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// RevisionStore is what garbage collection and traffic changes need of
// Nomad (nomadjob.Client).
type RevisionStore interface {
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
	Purge(ctx context.Context, revision string) error
}

// RecordStore is what garbage collection and traffic changes need of
// Consul (consulroute.Client).
type RecordStore interface {
	ReadRecord(ctx context.Context, namespace, service string) (consulroute.Record, uint64, error)
	Publish(ctx context.Context, rec consulroute.Record, casIndex uint64) error
}

// retention decides, for a service's revisions, which stay and why.
func retention(ctx context.Context, nomad RevisionStore, consul RecordStore, namespace, service string, policy consulroute.RetentionPolicy, now time.Time) ([]consulroute.RetentionDecision, []nomadjob.RevisionStatus, consulroute.Record, uint64, error) {
	revs, err := nomad.Revisions(ctx, namespace, service)
	if err != nil {
		return nil, nil, consulroute.Record{}, 0, err
	}
	rec, idx, err := consul.ReadRecord(ctx, namespace, service)
	if err != nil {
		return nil, revs, rec, 0, err
	}
	route, err := rec.Route()
	if err != nil {
		return nil, revs, rec, idx, err
	}
	states := make([]consulroute.RevisionState, 0, len(revs))
	for _, r := range revs {
		states = append(states, consulroute.RevisionState{
			Name: r.Name, Generation: r.Generation, Created: r.Created,
			Ready: r.Running > 0, Instances: r.Running + r.Starting,
		})
	}
	return consulroute.Retain(now, states, route, rec.Latest, policy), revs, rec, idx, nil
}

// Collect garbage-collects a service's old revisions: it deletes the ones
// the policy lets go, in an order that never routes to a missing revision:
// first they are marked deleting in the record (Publish removes their
// config entries, and traffic changes refuse them from then on), then their
// jobs are purged, then they leave the record. A run cut short leaves them
// marked, and the next run finishes.
func Collect(ctx context.Context, nomad RevisionStore, consul RecordStore, namespace, service string, policy consulroute.RetentionPolicy, now time.Time) ([]consulroute.RetentionDecision, error) {
	decisions, _, rec, idx, err := retention(ctx, nomad, consul, namespace, service, policy, now)
	if err != nil {
		if errors.Is(err, consulroute.ErrNotFound) {
			return nil, nil
		}
		return nil, err
	}
	var gone []consulroute.RetentionDecision
	deleting := slices.Clone(rec.Deleting)
	for _, d := range decisions {
		if !d.Keep {
			gone = append(gone, d)
			if !slices.Contains(deleting, d.Revision) {
				deleting = append(deleting, d.Revision)
			}
		}
	}
	if len(deleting) == 0 {
		return nil, nil
	}
	slices.Sort(deleting)
	rec.Deleting = deleting
	rec.UpdatedAt = now.UTC()
	if err := consul.Publish(ctx, rec, idx); err != nil {
		return nil, fmt.Errorf("mark %v deleting: %w", deleting, err)
	}
	for _, rev := range deleting {
		if err := nomad.Purge(ctx, rev); err != nil && !errors.Is(err, nomadjob.ErrNotFound) {
			return gone, fmt.Errorf("purge %s: %w", rev, err)
		}
	}
	rec, idx, err = consul.ReadRecord(ctx, namespace, service)
	if err != nil {
		return gone, err
	}
	rec.Revisions = slices.DeleteFunc(rec.Revisions, func(r string) bool { return slices.Contains(deleting, r) })
	rec.Deleting = slices.DeleteFunc(rec.Deleting, func(r string) bool { return slices.Contains(deleting, r) })
	rec.UpdatedAt = now.UTC()
	if err := consul.Publish(ctx, rec, idx); err != nil {
		return gone, fmt.Errorf("forget deleted revisions %v: %w", deleting, err)
	}
	return gone, nil
}
