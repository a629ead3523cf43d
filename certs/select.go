package certs

import (
	"crypto/tls"
	"crypto/x509"
	"strings"
	"time"
)

// Source is where a served certificate came from, in the order of
// precedence Select applies.
type Source string

const (
	// SourceFile: -tls-cert/-tls-key files given to serve.
	SourceFile Source = "file"
	// SourceConsul: a certificate an operator put in Consul KV under
	// consulroute.TLSSecretsPrefix.
	SourceConsul Source = "consul"
	// SourceACME: obtained by the gateway from the ACME directory.
	SourceACME Source = "acme"
)

// cert is one certificate with what selection needs to know of it.
type cert struct {
	tls    *tls.Certificate
	leaf   *x509.Certificate
	source Source
	origin string // its file, KV key or ACME directory
}

// names are the DNS names the certificate covers, lowercased.
func (c *cert) names() []string {
	out := make([]string, 0, len(c.leaf.DNSNames)+1)
	for _, n := range c.leaf.DNSNames {
		out = append(out, strings.ToLower(strings.TrimSuffix(n, ".")))
	}
	if len(out) == 0 && c.leaf.Subject.CommonName != "" {
		// A certificate without SANs: Go's clients refuse it, but say
		// what it was meant for.
		out = append(out, strings.ToLower(c.leaf.Subject.CommonName))
	}
	return out
}

// validAt reports whether now is within the certificate's validity.
func (c *cert) validAt(now time.Time) bool {
	return !now.Before(c.leaf.NotBefore) && !now.After(c.leaf.NotAfter)
}

// index finds the certificates of one source by name: exact names first,
// then a wildcard one label up ("*.example.com" covers "a.example.com",
// not "example.com" or "a.b.example.com", as RFC 6125 and browsers have
// it). It is built once and then only read.
type index struct {
	exact    map[string][]*cert
	wildcard map[string][]*cert // by the name below the "*."
	first    *cert              // the first certificate added (the default)
}

func newIndex(certs []*cert) *index {
	ix := &index{exact: map[string][]*cert{}, wildcard: map[string][]*cert{}}
	for _, c := range certs {
		if ix.first == nil {
			ix.first = c
		}
		for _, n := range c.names() {
			if rest, ok := strings.CutPrefix(n, "*."); ok {
				ix.wildcard[rest] = append(ix.wildcard[rest], c)
			} else {
				ix.exact[n] = append(ix.exact[n], c)
			}
		}
	}
	return ix
}

// lookup returns the certificate for name: an exact name wins over a
// wildcard; among several, the best at now (see better). nil when none
// covers name.
func (ix *index) lookup(name string, now time.Time) *cert {
	if ix == nil {
		return nil
	}
	if c := best(ix.exact[name], now); c != nil {
		return c
	}
	if _, parent, ok := strings.Cut(name, "."); ok && parent != "" {
		return best(ix.wildcard[parent], now)
	}
	return nil
}

// covers reports whether some certificate covers name, valid or not.
func (ix *index) covers(name string) bool {
	return ix.lookup(name, time.Time{}) != nil
}

// best picks among certificates for one name: one valid at now over one
// that is not (expired, or not valid yet: an operator who puts the next
// certificate beside the current one before it starts keeps serving the
// current one until then); between two of the same kind, the one that
// expires last (the newer one, after a renewal, without removing the old).
func best(cs []*cert, now time.Time) *cert {
	var b *cert
	for _, c := range cs {
		if b == nil {
			b = c
			continue
		}
		cv, bv := c.validAt(now), b.validAt(now)
		if cv != bv {
			if cv {
				b = c
			}
			continue
		}
		if c.leaf.NotAfter.After(b.leaf.NotAfter) {
			b = c
		}
	}
	return b
}

// normalName is the form names are looked up in: lower case, without a
// trailing dot.
func normalName(name string) string {
	return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(name), "."))
}
