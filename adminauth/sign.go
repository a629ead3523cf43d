package adminauth

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Scheme is the Authorization scheme of a signed admin request:
//
//	Authorization: NomadServerless-HMAC-SHA256 key=<id>,ts=<unix seconds>,nonce=<base64url>,sig=<base64url>
const Scheme = "NomadServerless-HMAC-SHA256"

// signedPrefix starts every signed string, so a signature made here can
// never be taken for one of some other protocol using the same key, and a
// future format can be told apart.
const signedPrefix = "nomad-serverless admin v1"

// nonceLen is the random part of a nonce: 128 bits never repeat by chance.
const nonceLen = 16

// stringToSign is what the HMAC covers. The host binds a request to the
// replica it was sent to (one captured on its way to one replica cannot be
// played to another), the body hash to its content, the timestamp and
// nonce to one moment and one use.
func stringToSign(method, host, requestURI, keyID string, ts int64, nonce string, body []byte) []byte {
	sum := sha256.Sum256(body)
	var b bytes.Buffer
	for _, part := range []string{signedPrefix, method, host, requestURI, keyID, strconv.FormatInt(ts, 10), nonce, hex.EncodeToString(sum[:])} {
		b.WriteString(part)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func mac(secret, msg []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(msg)
	return m.Sum(nil)
}

// requestHost is the host a request is addressed to, as the server will see
// it in r.Host.
func requestHost(req *http.Request) string {
	if req.Host != "" {
		return req.Host
	}
	return req.URL.Host
}

// Sign sets req's Authorization header for body (which must be exactly what
// req will send) with key at now.
func Sign(req *http.Request, key Key, body []byte, now time.Time) error {
	var raw [nonceLen]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return fmt.Errorf("sign %s %s: read a nonce: %w", req.Method, req.URL.Path, err)
	}
	nonce := base64.RawURLEncoding.EncodeToString(raw[:])
	ts := now.Unix()
	sig := mac(key.Secret, stringToSign(req.Method, requestHost(req), req.URL.RequestURI(), key.ID, ts, nonce, body))
	req.Header.Set("Authorization", fmt.Sprintf("%s key=%s,ts=%d,nonce=%s,sig=%s",
		Scheme, key.ID, ts, nonce, base64.RawURLEncoding.EncodeToString(sig)))
	return nil
}

// credentials are the parsed parameters of an Authorization header.
type credentials struct {
	keyID string
	ts    int64
	nonce string
	sig   []byte
}

var (
	errMissing   = errors.New("no Authorization header: admin API writes are for control-plane replicas only, signed with the key in Consul KV")
	errScheme    = errors.New("Authorization scheme is not " + Scheme)
	errMalformed = errors.New("malformed " + Scheme + " credentials")
)

// parseAuthorization reads "Scheme key=..,ts=..,nonce=..,sig=..".
func parseAuthorization(h string) (credentials, error) {
	if h == "" {
		return credentials{}, errMissing
	}
	scheme, params, _ := strings.Cut(h, " ")
	if !strings.EqualFold(scheme, Scheme) {
		return credentials{}, errScheme
	}
	var c credentials
	var haveTS bool
	for p := range strings.SplitSeq(params, ",") {
		name, value, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return credentials{}, errMalformed
		}
		switch name {
		case "key":
			if c.keyID != "" || !validKeyID(value) {
				return credentials{}, errMalformed
			}
			c.keyID = value
		case "ts":
			n, err := strconv.ParseInt(value, 10, 64)
			if haveTS || err != nil {
				return credentials{}, errMalformed
			}
			c.ts, haveTS = n, true
		case "nonce":
			raw, err := base64.RawURLEncoding.DecodeString(value)
			if c.nonce != "" || err != nil || len(raw) != nonceLen {
				return credentials{}, errMalformed
			}
			c.nonce = value
		case "sig":
			raw, err := base64.RawURLEncoding.DecodeString(value)
			if c.sig != nil || err != nil || len(raw) != sha256.Size {
				return credentials{}, errMalformed
			}
			c.sig = raw
		default:
			return credentials{}, errMalformed
		}
	}
	if c.keyID == "" || !haveTS || c.nonce == "" || c.sig == nil {
		return credentials{}, errMalformed
	}
	return c, nil
}

// Transport signs every request it carries with the signing key of its
// KeySource, then hands it to Base. Reads are signed too: it costs one HMAC
// and keeps one client for everything a replica asks another.
type Transport struct {
	keys KeySource
	base http.RoundTripper
	now  func() time.Time
	max  int64
}

// TransportConfig configures a Transport. Keys is required.
type TransportConfig struct {
	Keys KeySource
	// Base carries the signed requests; nil is http.DefaultTransport.
	Base http.RoundTripper
	// MaxBody bounds a body Transport reads to sign; default 4 MiB, the
	// admin API's own limit.
	MaxBody int64
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// DefaultMaxBody is the largest body signed or verified by default: the
// admin API's own limit on a demand report.
const DefaultMaxBody = 4 << 20

// NewTransport validates cfg.
func NewTransport(cfg TransportConfig) (*Transport, error) {
	if cfg.Keys == nil {
		return nil, errors.New("adminauth: TransportConfig.Keys is nil: give it the keyring read from Consul")
	}
	if cfg.MaxBody < 0 {
		return nil, errors.New("adminauth: TransportConfig.MaxBody is negative")
	}
	t := &Transport{keys: cfg.Keys, base: cfg.Base, now: cfg.Now, max: cfg.MaxBody}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.now == nil {
		t.now = time.Now
	}
	if t.max == 0 {
		t.max = DefaultMaxBody
	}
	return t, nil
}

// ErrNoKey: the keyring has not been read from Consul yet.
var ErrNoKey = errors.New("no admin API key read from Consul yet")

// RoundTrip implements http.RoundTripper. It leaves req as it was (the
// RoundTripper contract): the signed request is a clone.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody := func() {
		if req.Body != nil {
			req.Body.Close()
		}
	}
	ring := t.keys.Keyring()
	if ring == nil {
		closeBody()
		return nil, fmt.Errorf("sign %s %s: %w", req.Method, req.URL, ErrNoKey)
	}
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		b, err := io.ReadAll(io.LimitReader(req.Body, t.max+1))
		closeBody()
		if err != nil {
			return nil, fmt.Errorf("sign %s %s: read the body: %w", req.Method, req.URL, err)
		}
		if int64(len(b)) > t.max {
			return nil, fmt.Errorf("sign %s %s: body larger than %d bytes", req.Method, req.URL, t.max)
		}
		body = b
	}
	signed := req.Clone(req.Context())
	if body != nil {
		signed.Body = io.NopCloser(bytes.NewReader(body))
		signed.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		signed.ContentLength = int64(len(body))
	}
	now := t.now()
	if err := Sign(signed, ring.Signing(now), body, now); err != nil {
		return nil, err
	}
	return t.base.RoundTrip(signed)
}
