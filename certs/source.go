package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// FilePair is a certificate given to serve as files: the PEM chain (leaf
// first) and the PEM private key.
type FilePair struct {
	Cert, Key string
}

// parsePair makes a cert of a PEM chain and key.
func parsePair(chainPEM, keyPEM []byte, source Source, origin string) (*cert, error) {
	tc, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", origin, err)
	}
	leaf := tc.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(tc.Certificate[0]); err != nil {
			return nil, fmt.Errorf("%s: parse the leaf certificate: %w", origin, err)
		}
		tc.Leaf = leaf
	}
	c := &cert{tls: &tc, leaf: leaf, source: source, origin: origin}
	if len(c.names()) == 0 {
		return nil, fmt.Errorf("%s: the certificate names no DNS name (no subject alternative names)", origin)
	}
	return c, nil
}

// loadFile reads a FilePair.
func loadFile(p FilePair) (*cert, error) {
	chain, err := os.ReadFile(p.Cert)
	if err != nil {
		return nil, fmt.Errorf("read -tls-cert: %w", err)
	}
	key, err := os.ReadFile(p.Key)
	if err != nil {
		return nil, fmt.Errorf("read -tls-key: %w", err)
	}
	return parsePair(chain, key, SourceFile, p.Cert)
}

// parseBundle reads an operator's certificate from KV: PEM certificates
// (the leaf first) and one PEM private key, in any order.
func parseBundle(b []byte, origin string) (*cert, error) {
	var chain, key []byte
	rest := b
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		switch {
		case block.Type == "CERTIFICATE":
			chain = append(chain, pem.EncodeToMemory(block)...)
		case strings.HasSuffix(block.Type, "PRIVATE KEY"):
			if key != nil {
				return nil, fmt.Errorf("%s: more than one private key", origin)
			}
			key = pem.EncodeToMemory(block)
		}
	}
	switch {
	case chain == nil && key == nil:
		return nil, fmt.Errorf("%s: no PEM blocks (want the certificate chain and its private key, PEM, in one value)", origin)
	case chain == nil:
		return nil, fmt.Errorf("%s: no CERTIFICATE block", origin)
	case key == nil:
		return nil, fmt.Errorf("%s: no PRIVATE KEY block (the value holds the certificate chain and its private key)", origin)
	}
	return parsePair(chain, key, SourceConsul, origin)
}

// fileStamp is what tells a file changed.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stampOf(path string) (fileStamp, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{}, err
	}
	return fileStamp{mod: fi.ModTime(), size: fi.Size()}, nil
}

// loadFiles reads every pair and the stamps they were read at.
func loadFiles(pairs []FilePair) ([]*cert, []fileStamp, error) {
	certs := make([]*cert, 0, len(pairs))
	stamps := make([]fileStamp, 0, 2*len(pairs))
	var errs []error
	for _, p := range pairs {
		for _, f := range []string{p.Cert, p.Key} {
			s, err := stampOf(f)
			if err != nil {
				errs = append(errs, err)
			}
			stamps = append(stamps, s)
		}
		c, err := loadFile(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		certs = append(certs, c)
	}
	return certs, stamps, errors.Join(errs...)
}
