package adminauth

import (
	"bytes"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// VerifierConfig configures a Verifier. Keys is required.
type VerifierConfig struct {
	Keys KeySource
	// Window is how far a request's timestamp may be from the verifier's
	// clock, either way; default 30s. It bounds the clock skew tolerated
	// between replicas and how long nonces are remembered.
	Window time.Duration
	// MaxBody bounds a request body; default DefaultMaxBody.
	MaxBody int64
	// MaxNonces bounds the nonces remembered within one window; default
	// 65536 (replicas send a few requests a second each). Only requests
	// with a valid signature are remembered, so only key holders can fill
	// it; a full cache refuses with 503 rather than forget a nonce early.
	MaxNonces int
	// Now is the clock; nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer, when set, gets nomad_serverless_admin_auth_total{result}.
	Registerer prometheus.Registerer
}

// Verifier checks signed admin requests. Safe for concurrent use.
type Verifier struct {
	keys      KeySource
	window    time.Duration
	maxBody   int64
	maxNonces int
	now       func() time.Time
	log       *slog.Logger
	results   *prometheus.CounterVec

	mu        sync.Mutex
	seen      map[string]int64 // nonce -> unix second after which it is stale anyway
	nextSweep int64

	lastWarn atomic.Int64 // unix nanoseconds of the last refusal logged at Warn
}

// NewVerifier validates cfg.
func NewVerifier(cfg VerifierConfig) (*Verifier, error) {
	if cfg.Keys == nil {
		return nil, errors.New("adminauth: VerifierConfig.Keys is nil: give it the keyring read from Consul")
	}
	if cfg.Window < 0 || cfg.MaxBody < 0 || cfg.MaxNonces < 0 {
		return nil, errors.New("adminauth: VerifierConfig Window, MaxBody and MaxNonces must not be negative")
	}
	if cfg.Window != 0 && cfg.Window < time.Second {
		return nil, fmt.Errorf("adminauth: VerifierConfig.Window %s: timestamps are in seconds, want at least 1s", cfg.Window)
	}
	v := &Verifier{
		keys:      cfg.Keys,
		window:    cfg.Window,
		maxBody:   cfg.MaxBody,
		maxNonces: cfg.MaxNonces,
		now:       cfg.Now,
		log:       cfg.Logger,
		seen:      map[string]int64{},
		results: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nomad_serverless_admin_auth_total",
			Help: "Admin API writes checked, by result: accepted, or why they were refused.",
		}, []string{"result"}),
	}
	if v.window == 0 {
		v.window = 30 * time.Second
	}
	if v.maxBody == 0 {
		v.maxBody = DefaultMaxBody
	}
	if v.maxNonces == 0 {
		v.maxNonces = 1 << 16
	}
	if v.now == nil {
		v.now = time.Now
	}
	if v.log == nil {
		v.log = slog.New(slog.DiscardHandler)
	}
	v.log = v.log.With("component", "admin-auth")
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(v.results); err != nil {
			return nil, fmt.Errorf("adminauth: register metrics: %w", err)
		}
	}
	return v, nil
}

// Refusal is a request the Verifier did not accept: the HTTP status to answer
// and why.
type Refusal struct {
	Status int
	// Result is the metric label: missing, scheme, malformed, stale,
	// no_key, unknown_key, too_large, bad_signature, replayed, busy.
	Result string
	Err    error
}

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

func refuse(status int, result string, err error) *Refusal {
	return &Refusal{Status: status, Result: result, Err: err}
}

// Verify checks r's signature. On success r.Body is replaced by the body it
// read (so the handler reads the same bytes that were verified) and the
// nonce is remembered; on failure it returns a *Refusal and r must not be
// acted on. Cheap checks come first, so an unauthenticated caller costs no
// body read and no HMAC unless its header names a key we have.
func (v *Verifier) Verify(r *http.Request) error {
	err := v.verify(r)
	result := "accepted"
	if ref, ok := errors.AsType[*Refusal](err); ok {
		result = ref.Result
	}
	v.results.WithLabelValues(result).Inc()
	return err
}

func (v *Verifier) verify(r *http.Request) error {
	c, err := parseAuthorization(r.Header.Get("Authorization"))
	if err != nil {
		result := "malformed"
		switch {
		case errors.Is(err, errMissing):
			result = "missing"
		case errors.Is(err, errScheme):
			result = "scheme"
		}
		return refuse(http.StatusUnauthorized, result, err)
	}
	now := v.now()
	if d := now.Sub(time.Unix(c.ts, 0)); d > v.window || d < -v.window {
		return refuse(http.StatusUnauthorized, "stale", fmt.Errorf("signed at %s, %s from this replica's clock, outside the %s window (replayed, or the replicas' clocks disagree)",
			time.Unix(c.ts, 0).UTC().Format(time.RFC3339), d.Round(time.Second), v.window))
	}
	ring := v.keys.Keyring()
	if ring == nil {
		return refuse(http.StatusServiceUnavailable, "no_key", fmt.Errorf("this replica has %w", ErrNoKey))
	}
	key, ok := ring.Lookup(c.keyID)
	if !ok {
		return refuse(http.StatusUnauthorized, "unknown_key", fmt.Errorf("signed with key %q, which is not in this replica's admin API keyring (a different Consul datacenter, or a key rotated away)", c.keyID))
	}
	if r.ContentLength > v.maxBody {
		return refuse(http.StatusRequestEntityTooLarge, "too_large", fmt.Errorf("body of %d bytes, more than %d", r.ContentLength, v.maxBody))
	}
	var body []byte
	if r.Body != nil {
		body, err = io.ReadAll(io.LimitReader(r.Body, v.maxBody+1))
		if err != nil {
			return refuse(http.StatusBadRequest, "malformed", fmt.Errorf("read the body: %w", err))
		}
		if int64(len(body)) > v.maxBody {
			return refuse(http.StatusRequestEntityTooLarge, "too_large", fmt.Errorf("body larger than %d bytes", v.maxBody))
		}
	}
	want := mac(key.Secret, stringToSign(r.Method, r.Host, r.URL.RequestURI(), c.keyID, c.ts, c.nonce, body))
	if !hmac.Equal(want, c.sig) {
		return refuse(http.StatusUnauthorized, "bad_signature", errors.New("signature does not match the request (wrong key, or the request was changed on its way)"))
	}
	if err := v.remember(c.nonce, c.ts, now); err != nil {
		return err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	return nil
}

// remember records a verified nonce, refusing one seen before within the
// window.
func (v *Verifier) remember(nonce string, ts int64, now time.Time) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	sec := now.Unix()
	if sec >= v.nextSweep {
		for n, until := range v.seen {
			if until < sec {
				delete(v.seen, n)
			}
		}
		v.nextSweep = sec + int64(v.window/time.Second)
	}
	if _, dup := v.seen[nonce]; dup {
		return refuse(http.StatusUnauthorized, "replayed", errors.New("nonce already used: a replayed request"))
	}
	if len(v.seen) >= v.maxNonces {
		return refuse(http.StatusServiceUnavailable, "busy", fmt.Errorf("%d signed requests within %s: refusing more until older nonces expire", len(v.seen), v.window))
	}
	// Past ts+window the timestamp check refuses the request anyway.
	v.seen[nonce] = ts + int64(v.window/time.Second) + 1
	return nil
}

// errorBody is the admin API's error shape, so callers read refusals as they
// read every other admin error.
type errorBody struct {
	Error string `json:"error"`
}

// Wrap returns next behind Verify: a request that fails it is answered with
// its Refusal's status and a JSON {"error": ...}, and never reaches next.
func (v *Verifier) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		err := v.Verify(r)
		if err == nil {
			next.ServeHTTP(w, r)
			return
		}
		status, result := http.StatusUnauthorized, "refused"
		if ref, ok := errors.AsType[*Refusal](err); ok {
			status, result = ref.Status, ref.Result
		}
		v.logRefusal(r, result, err)
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", Scheme)
		}
		w.Header().Set("Content-Type", "application/json")
		// A refused request's body may be unread: do not keep the
		// connection for whatever follows it.
		w.Header().Set("Connection", "close")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(errorBody{Error: "admin API: " + err.Error()})
	})
}

// logRefusal logs refusals at Debug, and one a minute at Warn: a replica
// refused by another (replicas on different keys, skewed clocks) is worth an
// operator's attention, but anyone who reaches the port can cause refusals,
// and must not be able to flood the log.
func (v *Verifier) logRefusal(r *http.Request, result string, err error) {
	now := v.now().UnixNano()
	last := v.lastWarn.Load()
	level := slog.LevelDebug
	if now-last >= int64(time.Minute) && v.lastWarn.CompareAndSwap(last, now) {
		level = slog.LevelWarn
	}
	v.log.Log(r.Context(), level, "refused an admin API write",
		"method", r.Method, "path", r.URL.Path, "remote", r.RemoteAddr, "result", result, "err", err)
}
