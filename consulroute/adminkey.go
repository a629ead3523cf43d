package consulroute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/adminauth"
)

// ControlPlaneKVPrefix holds what only the control plane may read. The
// control-plane ACL policy grants it write, the deploy policy denies it.
const ControlPlaneKVPrefix = "nomad-serverless/control-plane/"

// AdminKeysKey is the admin API's keyring: the HMAC keys replicas sign
// their writes to each other's admin API with (adminauth).
const AdminKeysKey = ControlPlaneKVPrefix + "admin-keys"

// adminKeysVersion is the record's format; a replica refuses one it does not
// know instead of misreading it.
const adminKeysVersion = 1

// maxAdminKeys is how many keys a rotation keeps: the new one, the one
// replicas sign with until the new one's NotBefore, and the one before
// that for a second rotation within the grace.
const maxAdminKeys = 3

type adminKeysRecord struct {
	Version int              `json:"version"`
	Keys    []adminKeyRecord `json:"keys"`
}

type adminKeyRecord struct {
	ID        string    `json:"id"`
	Secret    []byte    `json:"secret"` // base64 in JSON
	NotBefore time.Time `json:"not_before,omitzero"`
}

func encodeAdminKeys(ring *adminauth.Keyring) ([]byte, error) {
	rec := adminKeysRecord{Version: adminKeysVersion}
	for _, k := range ring.Keys() {
		rec.Keys = append(rec.Keys, adminKeyRecord{ID: k.ID, Secret: k.Secret, NotBefore: k.NotBefore})
	}
	return json.MarshalIndent(rec, "", "  ")
}

func decodeAdminKeys(b []byte) (*adminauth.Keyring, error) {
	var rec adminKeysRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("decode %s: %w", AdminKeysKey, err)
	}
	if rec.Version != adminKeysVersion {
		return nil, fmt.Errorf("decode %s: version %d, this binary reads %d (upgrade it)", AdminKeysKey, rec.Version, adminKeysVersion)
	}
	keys := make([]adminauth.Key, len(rec.Keys))
	for i, k := range rec.Keys {
		keys[i] = adminauth.Key{ID: k.ID, Secret: k.Secret, NotBefore: k.NotBefore}
	}
	ring, err := adminauth.NewKeyring(keys)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", AdminKeysKey, err)
	}
	return ring, nil
}

// AdminKeys reads the admin API's keyring and the key's modify index. When
// there is none, it creates one with a single fresh key, with check-and-set
// on index 0 (create only), so replicas starting together agree: one
// creates it, the others lose the check-and-set and read the winner's.
func (c *Client) AdminKeys(ctx context.Context) (*adminauth.Keyring, uint64, error) {
	for range 5 {
		p, _, err := c.api.KV().Get(AdminKeysKey, c.q(ctx))
		if err != nil {
			return nil, 0, c.wrap("read the admin API keyring "+AdminKeysKey, err)
		}
		if p != nil {
			ring, err := decodeAdminKeys(p.Value)
			if err != nil {
				return nil, 0, err
			}
			return ring, p.ModifyIndex, nil
		}
		if err := c.createAdminKeys(ctx); err != nil {
			return nil, 0, err
		}
		// Created, or lost the race to another replica: read what won.
	}
	return nil, 0, fmt.Errorf("read the admin API keyring %s: it disappears as soon as it is created (is something deleting it?)", AdminKeysKey)
}

// createAdminKeys writes a keyring of one new key unless the key exists.
func (c *Client) createAdminKeys(ctx context.Context) error {
	now := time.Now()
	key, err := adminauth.NewKey(now, time.Time{})
	if err != nil {
		return err
	}
	ring, err := adminauth.NewKeyring([]adminauth.Key{key})
	if err != nil {
		return fmt.Errorf("create the admin API keyring: %w", err)
	}
	body, err := encodeAdminKeys(ring)
	if err != nil {
		return fmt.Errorf("create the admin API keyring: %w", err)
	}
	ok, _, err := c.api.KV().CAS(&api.KVPair{Key: AdminKeysKey, Value: body, ModifyIndex: 0}, c.w(ctx))
	if err != nil {
		return c.wrap("create the admin API keyring "+AdminKeysKey, err)
	}
	if ok {
		c.log.InfoContext(ctx, "created the admin API keyring", "key", AdminKeysKey, "id", key.ID)
	}
	return nil
}

// WatchAdminKeys follows the keyring with blocking queries and calls set
// with it at start and after every change: a rotation reaches every replica
// within one round trip. A deleted keyring is created afresh
// (check-and-set, so once whoever notices first); a keyring that does not
// decode is logged and skipped, keeping the last good one, since refusing
// every replica's writes would stall every wake. It returns nil when ctx
// ends; Consul errors are retried with backoff. set is called from one
// goroutine.
func (c *Client) WatchAdminKeys(ctx context.Context, set func(*adminauth.Keyring)) error {
	if set == nil {
		return errors.New("watch the admin API keyring: set is nil")
	}
	var latest []byte
	c.watch(ctx, "admin API keyring", func(q *api.QueryOptions) (uint64, error) {
		p, meta, err := c.api.KV().Get(AdminKeysKey, q)
		if err != nil {
			return 0, c.wrap("watch the admin API keyring "+AdminKeysKey, err)
		}
		latest = nil
		if p == nil {
			// Deleted (an operator's hard rotation): make a new one;
			// the next query, on this index, returns it at once.
			if err := c.createAdminKeys(ctx); err != nil {
				return 0, err
			}
			return meta.LastIndex, nil
		}
		latest = p.Value
		return meta.LastIndex, nil
	}, func() {
		if latest == nil {
			return
		}
		ring, err := decodeAdminKeys(latest)
		if err != nil {
			c.log.ErrorContext(ctx, "the admin API keyring in Consul does not decode; keeping the last good one", "err", err)
			return
		}
		set(ring)
	})
	return nil
}

// RotateAdminKeys adds a new key to the keyring, used for signing from
// grace on (verifiers accept it as soon as they read it, within a round
// trip of the write), and keeps the newest previous keys (maxAdminKeys in
// all). Replicas then move to the new key without refusing each other;
// the oldest key goes at the next rotation. Check-and-set retries on a
// concurrent change.
func (c *Client) RotateAdminKeys(ctx context.Context, grace time.Duration) (adminauth.Key, error) {
	if grace < 0 {
		return adminauth.Key{}, fmt.Errorf("rotate the admin API keyring: grace %s is negative", grace)
	}
	for range 5 {
		cur, index, err := c.AdminKeys(ctx)
		if err != nil {
			return adminauth.Key{}, fmt.Errorf("rotate the admin API keyring: %w", err)
		}
		now := time.Now()
		key, err := adminauth.NewKey(now, now.Add(grace))
		if err != nil {
			return adminauth.Key{}, err
		}
		keys := append([]adminauth.Key{key}, cur.Keys()...)
		ring, err := adminauth.NewKeyring(keys[:min(len(keys), maxAdminKeys)])
		if err != nil {
			return adminauth.Key{}, fmt.Errorf("rotate the admin API keyring: %w", err)
		}
		body, err := encodeAdminKeys(ring)
		if err != nil {
			return adminauth.Key{}, fmt.Errorf("rotate the admin API keyring: %w", err)
		}
		ok, _, err := c.api.KV().CAS(&api.KVPair{Key: AdminKeysKey, Value: body, ModifyIndex: index}, c.w(ctx))
		if err != nil {
			return adminauth.Key{}, c.wrap("rotate the admin API keyring "+AdminKeysKey, err)
		}
		if ok {
			return key, nil
		}
	}
	return adminauth.Key{}, fmt.Errorf("rotate the admin API keyring %s: %w five times", AdminKeysKey, ErrConflict)
}
