package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"math/big"
	"testing"
)

func TestUnitPublicKeysPEM(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	doc := fmt.Sprintf(`{"keys":[{"kty":"OKP","kid":"x"},{"kty":"RSA","kid":"k1","n":%q,"e":%q}]}`,
		base64.RawURLEncoding.EncodeToString(key.N.Bytes()), base64.RawURLEncoding.EncodeToString(big.NewInt(int64(key.E)).Bytes()))
	keys, err := PublicKeysPEM([]byte(doc))
	if err != nil || len(keys) != 1 {
		t.Fatalf("PublicKeysPEM: %d keys, %v; want 1", len(keys), err)
	}
	b, _ := pem.Decode([]byte(keys[0]))
	pub, err := x509.ParsePKIXPublicKey(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if !key.PublicKey.Equal(pub) {
		t.Fatal("the PEM key is not the JWKS key")
	}
	if _, err := PublicKeysPEM([]byte(`{"keys":[]}`)); err == nil {
		t.Fatal("no keys: want an error")
	}
}
