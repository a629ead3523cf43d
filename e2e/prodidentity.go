package e2e

import (
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
)

// Nomad's workload identities reach Consul through a JWT auth method and
// two binding rules, as `nomad setup consul` makes them: a service's
// identity becomes a service identity of that service, a task's identity
// the role nomad-<namespace>. The auth method checks the JWTs against
// Nomad's public keys. `nomad setup consul` points it at Nomad's JWKS URL;
// here Nomad's HTTP API requires a client certificate (mutual TLS), which
// Consul's JWKS fetcher cannot show, so the auth method holds Nomad's
// public keys instead (JWTValidationPubKeys), read once by the harness.

// WorkloadAuthMethod is the auth method's name, as `nomad setup consul`
// names it and Nomad's consul block defaults to.
const WorkloadAuthMethod = "nomad-workloads"

// JWKS is Nomad's /.well-known/jwks.json.
type JWKS struct {
	Keys []struct {
		Kty string `json:"kty"`
		Kid string `json:"kid"`
		N   string `json:"n"`
		E   string `json:"e"`
	} `json:"keys"`
}

// PublicKeysPEM turns the RSA keys of a JWKS document into PEM public keys.
func PublicKeysPEM(doc []byte) ([]string, error) {
	var j JWKS
	if err := json.Unmarshal(doc, &j); err != nil {
		return nil, fmt.Errorf("read Nomad's JWKS: %w", err)
	}
	var out []string
	for _, k := range j.Keys {
		if k.Kty != "RSA" {
			continue
		}
		n, err := base64.RawURLEncoding.DecodeString(k.N)
		if err != nil {
			return nil, fmt.Errorf("read Nomad's JWKS key %s: n: %w", k.Kid, err)
		}
		e, err := base64.RawURLEncoding.DecodeString(k.E)
		if err != nil {
			return nil, fmt.Errorf("read Nomad's JWKS key %s: e: %w", k.Kid, err)
		}
		pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
		der, err := x509.MarshalPKIXPublicKey(pub)
		if err != nil {
			return nil, fmt.Errorf("encode Nomad's JWKS key %s: %w", k.Kid, err)
		}
		out = append(out, string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})))
	}
	if len(out) == 0 {
		return nil, errors.New("read Nomad's JWKS: no RSA key")
	}
	return out, nil
}

// WorkloadAuthMethodConfig is the JWT auth method's Config, as `nomad
// setup consul` writes it but with the keys themselves.
func WorkloadAuthMethodConfig(pubKeys []string) map[string]any {
	return map[string]any{
		"JWTValidationPubKeys": pubKeys,
		"JWTSupportedAlgs":     []string{"RS256"},
		"BoundAudiences":       []string{"consul.io"},
		"ClaimMappings": map[string]string{
			"nomad_namespace": "nomad_namespace",
			"nomad_job_id":    "nomad_job_id",
			"nomad_task":      "nomad_task",
			"nomad_service":   "nomad_service",
		},
	}
}
