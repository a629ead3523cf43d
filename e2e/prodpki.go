package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// The production scenario's agents use mutual TLS for HTTP and RPC with a
// CA the harness makes here, with Go's crypto, rather than with `consul tls
// ca create`: one CA for both agents, no CLI output to parse, and the
// certificates' names (server.global.nomad, server.dc1.consul, the nodes'
// loopback addresses) chosen by the test, which also needs a second,
// unrelated CA for the "wrong CA" error.

// CA is a certificate authority that signs the agents' and users'
// certificates.
type CA struct {
	Cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	CertPEM []byte
}

// NewCA makes a self-signed CA named name, valid from an hour ago for a day
// (the scenario's lifetime, with room for clock skew).
func NewCA(name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("make CA %s: generate key: %w", name, err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, fmt.Errorf("make CA %s: %w", name, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("make CA %s: sign: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("make CA %s: parse: %w", name, err)
	}
	return &CA{Cert: cert, key: key, CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// Leaf is a certificate and its key, PEM-encoded.
type Leaf struct{ CertPEM, KeyPEM []byte }

// Issue signs a certificate for cn valid for both server and client auth
// (the agents are both to each other: mutual TLS on RPC), with dnsNames and
// ips as its SANs.
func (ca *CA) Issue(cn string, dnsNames []string, ips []net.IP) (Leaf, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Leaf{}, fmt.Errorf("issue %s: generate key: %w", cn, err)
	}
	serial, err := newSerial()
	if err != nil {
		return Leaf{}, fmt.Errorf("issue %s: %w", cn, err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     dnsNames,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		return Leaf{}, fmt.Errorf("issue %s: sign: %w", cn, err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Leaf{}, fmt.Errorf("issue %s: encode key: %w", cn, err)
	}
	return Leaf{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// TLSFiles are the paths an agent's or a user's tls settings name.
type TLSFiles struct{ CA, Cert, Key string }

// Write puts the CA and the leaf in dir as name-ca.pem, name.pem and
// name-key.pem (the key readable by the owner only).
func (ca *CA) Write(dir, name string, l Leaf) (TLSFiles, error) {
	f := TLSFiles{
		CA:   filepath.Join(dir, name+"-ca.pem"),
		Cert: filepath.Join(dir, name+".pem"),
		Key:  filepath.Join(dir, name+"-key.pem"),
	}
	for _, w := range []struct {
		path string
		b    []byte
		mode os.FileMode
	}{{f.CA, ca.CertPEM, 0o644}, {f.Cert, l.CertPEM, 0o644}, {f.Key, l.KeyPEM, 0o600}} {
		if err := os.WriteFile(w.path, w.b, w.mode); err != nil {
			return TLSFiles{}, fmt.Errorf("write %s's TLS files: %w", name, err)
		}
	}
	return f, nil
}

// GossipKey is a Consul gossip encryption key: 32 random bytes, base64, as
// `consul keygen` prints.
func GossipKey() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a gossip key: %w", err)
	}
	return base64.StdEncoding.EncodeToString(b), nil
}

func newSerial() (*big.Int, error) {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("make a serial number: %w", err)
	}
	return n, nil
}
