package certs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"

	"github.com/caddyserver/certmagic"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// Storage is certmagic's storage in Consul KV, shared by every replica:
// the ACME account key, each certificate with its private key and
// metadata, and the challenge tokens in flight, under Prefix; and the
// locks certmagic takes around an order or a renewal, as Consul-session
// locks (consulroute.Mutexes) under their own prefix. A replica that takes
// the lock of a name first looks in storage for what another replica
// obtained meanwhile (certmagic does), so a name is ordered once for the
// cluster, and every replica serves what that order stored.
//
// Keys are certmagic's, with "/" as the separator, below Prefix; a
// "directory" is a key prefix that ends at a "/".
type Storage struct {
	c      *consulroute.Client
	prefix string
	locks  *consulroute.Mutexes
}

var (
	_ certmagic.Storage   = (*Storage)(nil)
	_ certmagic.TryLocker = (*Storage)(nil)
)

// NewStorage keeps certmagic's keys under prefix (a KV folder ending in
// "/", normally consulroute.TLSStorePrefix) and takes its locks through
// locks.
func NewStorage(c *consulroute.Client, prefix string, locks *consulroute.Mutexes) (*Storage, error) {
	if c == nil || locks == nil {
		return nil, errors.New("certificate storage: the Consul client and the locks are required")
	}
	if !strings.HasSuffix(prefix, "/") || strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("certificate storage: prefix %q: want a KV folder such as %s", prefix, consulroute.TLSStorePrefix)
	}
	return &Storage{c: c, prefix: prefix, locks: locks}, nil
}

func (s *Storage) key(k string) string { return s.prefix + strings.Trim(k, "/") }

// notExist turns consulroute's ErrNotFound into fs.ErrNotExist, which is
// what certmagic tests for.
func notExist(err error, key string) error {
	if errors.Is(err, consulroute.ErrNotFound) {
		return fmt.Errorf("%s: %w", key, fs.ErrNotExist)
	}
	return err
}

// Store writes value at key.
func (s *Storage) Store(ctx context.Context, key string, value []byte) error {
	return s.c.KVPut(ctx, s.key(key), value)
}

// Load reads key; fs.ErrNotExist when there is none.
func (s *Storage) Load(ctx context.Context, key string) ([]byte, error) {
	e, err := s.c.KVGet(ctx, s.key(key))
	if err != nil {
		return nil, notExist(err, key)
	}
	return e.Value, nil
}

// Delete deletes key and, when it is a directory, everything in it.
func (s *Storage) Delete(ctx context.Context, key string) error {
	return s.c.KVDelete(ctx, s.key(key))
}

// Exists reports whether key is a file or a directory.
func (s *Storage) Exists(ctx context.Context, key string) bool {
	if _, err := s.c.KVGet(ctx, s.key(key)); err == nil {
		return true
	}
	keys, err := s.c.KVKeys(ctx, s.key(key)+"/", "/")
	return err == nil && len(keys) > 0
}

// List lists the keys in the directory dir: with recursive, every file
// below it; without, its files and directories one level down. An empty
// or missing directory is fs.ErrNotExist.
func (s *Storage) List(ctx context.Context, dir string, recursive bool) ([]string, error) {
	base := s.key(dir) + "/"
	if strings.Trim(dir, "/") == "" {
		base = s.prefix
	}
	sep := "/"
	if recursive {
		sep = ""
	}
	keys, err := s.c.KVKeys(ctx, base, sep)
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("%s: %w", dir, fs.ErrNotExist)
	}
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, strings.TrimSuffix(strings.TrimPrefix(k, s.prefix), "/"))
	}
	return out, nil
}

// Stat describes key: a file with its size and time, or a directory.
func (s *Storage) Stat(ctx context.Context, key string) (certmagic.KeyInfo, error) {
	e, err := s.c.KVGet(ctx, s.key(key))
	if err == nil {
		return certmagic.KeyInfo{Key: key, Modified: e.Modified, Size: int64(len(e.Value)), IsTerminal: true}, nil
	}
	if !errors.Is(err, consulroute.ErrNotFound) {
		return certmagic.KeyInfo{}, err
	}
	keys, kerr := s.c.KVKeys(ctx, s.key(key)+"/", "/")
	if kerr != nil {
		return certmagic.KeyInfo{}, kerr
	}
	if len(keys) == 0 {
		return certmagic.KeyInfo{}, notExist(err, key)
	}
	return certmagic.KeyInfo{Key: key, IsTerminal: false}, nil
}

// Lock blocks until this replica holds the lock name (for the cluster) or
// ctx ends.
func (s *Storage) Lock(ctx context.Context, name string) error { return s.locks.Lock(ctx, name) }

// TryLock takes the lock name if nobody holds it.
func (s *Storage) TryLock(ctx context.Context, name string) (bool, error) {
	return s.locks.TryLock(ctx, name)
}

// Unlock releases the lock name.
func (s *Storage) Unlock(ctx context.Context, name string) error { return s.locks.Unlock(ctx, name) }

// String names the storage in certmagic's logs.
func (s *Storage) String() string { return "consul:" + s.prefix }
