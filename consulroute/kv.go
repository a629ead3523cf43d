package consulroute

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// TLSKVPrefix holds the gateway's TLS material: the ACME account key, the
// certificates it obtained and their private keys (TLSStorePrefix), and
// the certificates an operator put there by name (TLSSecretsPrefix). It is
// under ControlPlaneKVPrefix, so the deploy policy's deny covers it and
// only the control plane's policy reads it.
const TLSKVPrefix = ControlPlaneKVPrefix + "tls/"

// TLSStorePrefix is the ACME client's storage (certmagic's layout below
// it: acme/ for accounts, certificates/ for certificates and keys, locks/
// for the named locks of its orders).
const TLSStorePrefix = TLSKVPrefix + "store/"

// TLSSecretsPrefix holds certificates an operator provides: one key per
// certificate, its value the PEM certificate chain followed by the PEM
// private key (`consul kv put <prefix>www.example.com @bundle.pem`). The
// key's name is for people; the gateway reads the names the certificate
// itself covers.
const TLSSecretsPrefix = TLSKVPrefix + "secrets/"

// KVEntry is one key as KV ops read it.
type KVEntry struct {
	Key   string
	Value []byte
	// Modified is when KVPut last wrote the key (zero when something else
	// wrote it): Consul keeps no time, so KVPut stores the write's time in
	// the key's flags, in Unix milliseconds.
	Modified    time.Time
	ModifyIndex uint64
}

func kvEntry(p *api.KVPair) KVEntry {
	e := KVEntry{Key: p.Key, Value: p.Value, ModifyIndex: p.ModifyIndex}
	if p.Flags != 0 {
		e.Modified = time.UnixMilli(int64(p.Flags))
	}
	return e
}

// KVGet reads one key. A key that does not exist is an error that
// errors.Is ErrNotFound.
func (c *Client) KVGet(ctx context.Context, key string) (KVEntry, error) {
	p, _, err := c.api.KV().Get(key, c.q(ctx))
	if err != nil {
		return KVEntry{}, c.wrap("read "+key, err)
	}
	if p == nil {
		return KVEntry{}, fmt.Errorf("read %s: %w", key, ErrNotFound)
	}
	return kvEntry(p), nil
}

// KVPut writes a key, stamping the time in its flags (see KVEntry).
func (c *Client) KVPut(ctx context.Context, key string, value []byte) error {
	p := &api.KVPair{Key: key, Value: value, Flags: uint64(time.Now().UnixMilli())}
	if _, err := c.api.KV().Put(p, c.w(ctx)); err != nil {
		return c.wrap("write "+key, err)
	}
	return nil
}

// KVDelete deletes a key and every key below it as a folder (key + "/"),
// and not keys that merely start with the same letters ("a/b" deletes
// "a/b" and "a/b/c", not "a/bc"). A key that does not exist is no error.
func (c *Client) KVDelete(ctx context.Context, key string) error {
	key = strings.TrimSuffix(key, "/")
	if _, err := c.api.KV().Delete(key, c.w(ctx)); err != nil {
		return c.wrap("delete "+key, err)
	}
	if _, err := c.api.KV().DeleteTree(key+"/", c.w(ctx)); err != nil {
		return c.wrap("delete "+key+"/", err)
	}
	return nil
}

// KVKeys lists the keys under prefix, sorted. With a separator, a key is
// cut after the first separator that follows the prefix and duplicates are
// folded (the "folders" one level down, as `consul kv get -keys` shows). No
// key is an empty list, not an error.
func (c *Client) KVKeys(ctx context.Context, prefix, separator string) ([]string, error) {
	keys, _, err := c.api.KV().Keys(prefix, separator, c.q(ctx))
	if err != nil {
		return nil, c.wrap("list keys under "+prefix, err)
	}
	slices.Sort(keys)
	return keys, nil
}

// WatchKVPrefix follows every key under prefix with blocking queries and
// calls fn with all of them, sorted by key, at start and after every
// change. fn is called from one goroutine. It returns nil when ctx ends;
// Consul errors are retried with backoff.
func (c *Client) WatchKVPrefix(ctx context.Context, prefix string, fn func([]KVEntry)) error {
	if fn == nil {
		return errors.New("watch " + prefix + ": fn is nil")
	}
	var latest []KVEntry
	c.watch(ctx, prefix, func(q *api.QueryOptions) (uint64, error) {
		pairs, meta, err := c.api.KV().List(prefix, q)
		if err != nil {
			return 0, c.wrap("watch "+prefix, err)
		}
		latest = latest[:0:0]
		for _, p := range pairs {
			if p != nil {
				latest = append(latest, kvEntry(p))
			}
		}
		slices.SortFunc(latest, func(a, b KVEntry) int { return strings.Compare(a.Key, b.Key) })
		return meta.LastIndex, nil
	}, func() { fn(latest) })
	return nil
}
