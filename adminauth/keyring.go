// Package adminauth authenticates writes to the control plane's admin API
// between control-plane replicas: every request carries an HMAC-SHA256 over
// its method, host, path, body, a timestamp and a random nonce, made with a
// key every replica reads from Consul KV (consulroute.AdminKeysKey, readable
// only under the control-plane ACL policy). A verifier accepts a request
// only when the signature matches a key of the current keyring, the
// timestamp is within its window, and the nonce has not been seen in that
// window (no replay).
//
// The package is plain net/http and crypto: the KV side lives in
// consulroute, the wiring in serve.
package adminauth

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
)

// MinSecretLen is the shortest secret a Key may have: 256 bits, the size of
// HMAC-SHA256's output, below which a longer key adds nothing and a shorter
// one weakens it.
const MinSecretLen = 32

// Key is one signing key of the control plane.
type Key struct {
	// ID names the key in signed requests, so a verifier knows which key
	// of its keyring to check against without trying them all.
	ID string
	// Secret is the HMAC key, at least MinSecretLen bytes.
	Secret []byte
	// NotBefore is when replicas start signing with it. Verifiers accept
	// it at once: a rotation publishes the new key first and has it used
	// only once every replica has had the time to read it.
	NotBefore time.Time
}

// NewKey makes a key with a fresh random secret. Its ID is the creation time
// and a random suffix, so an operator reading the keyring sees which key is
// which and when it was made.
func NewKey(now, notBefore time.Time) (Key, error) {
	secret := make([]byte, MinSecretLen)
	if _, err := rand.Read(secret); err != nil {
		return Key{}, fmt.Errorf("make an admin API key: read random bytes: %w", err)
	}
	var suffix [4]byte
	if _, err := rand.Read(suffix[:]); err != nil {
		return Key{}, fmt.Errorf("make an admin API key: read random bytes: %w", err)
	}
	return Key{
		ID:        now.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(suffix[:]),
		Secret:    secret,
		NotBefore: notBefore.UTC(),
	}, nil
}

// validKeyID: IDs travel in the Authorization header's parameter list, so
// only characters that need no quoting there.
func validKeyID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, c := range []byte(id) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return false
		}
	}
	return true
}

// Keyring is an immutable set of keys. It is replaced whole when Consul says
// the keys changed, so readers on the request path take no lock.
type Keyring struct {
	keys []Key // newest NotBefore first
}

// NewKeyring validates keys (at least one; IDs unique and header-safe;
// secrets at least MinSecretLen bytes) and copies them.
func NewKeyring(keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("admin API keyring is empty")
	}
	seen := map[string]bool{}
	out := make([]Key, 0, len(keys))
	for _, k := range keys {
		switch {
		case !validKeyID(k.ID):
			return nil, fmt.Errorf("admin API key id %q: want 1 to 64 of A-Z a-z 0-9 - _ .", k.ID)
		case seen[k.ID]:
			return nil, fmt.Errorf("admin API key id %q appears twice", k.ID)
		case len(k.Secret) < MinSecretLen:
			return nil, fmt.Errorf("admin API key %s: secret of %d bytes, want at least %d", k.ID, len(k.Secret), MinSecretLen)
		}
		seen[k.ID] = true
		out = append(out, Key{ID: k.ID, Secret: slices.Clone(k.Secret), NotBefore: k.NotBefore})
	}
	slices.SortStableFunc(out, func(a, b Key) int { return b.NotBefore.Compare(a.NotBefore) })
	return &Keyring{keys: out}, nil
}

// Keys returns a copy of the keys, newest first.
func (k *Keyring) Keys() []Key {
	out := make([]Key, len(k.keys))
	for i, key := range k.keys {
		out[i] = Key{ID: key.ID, Secret: slices.Clone(key.Secret), NotBefore: key.NotBefore}
	}
	return out
}

// Signing is the key to sign with at now: the newest one whose NotBefore has
// passed, or the oldest one if none has (a keyring someone wrote with only
// future keys still signs).
func (k *Keyring) Signing(now time.Time) Key {
	for _, key := range k.keys {
		if !key.NotBefore.After(now) {
			return key
		}
	}
	return k.keys[len(k.keys)-1]
}

// Lookup finds a key by ID for verification.
func (k *Keyring) Lookup(id string) (Key, bool) {
	for _, key := range k.keys {
		if key.ID == id {
			return key, true
		}
	}
	return Key{}, false
}

// KeySource gives the keyring in force now; nil while none is known yet.
type KeySource interface {
	Keyring() *Keyring
}

// Ring holds the current Keyring for signers and verifiers; Set swaps it
// (from the Consul watch). The zero Ring holds none. Safe for concurrent use.
type Ring struct {
	cur atomic.Pointer[Keyring]
}

// Keyring implements KeySource.
func (r *Ring) Keyring() *Keyring { return r.cur.Load() }

// Set makes k the keyring in force.
func (r *Ring) Set(k *Keyring) { r.cur.Store(k) }
