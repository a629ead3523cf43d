package certs

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/caddyserver/certmagic"
	"github.com/mholt/acmez/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// LetsEncrypt and LetsEncryptStaging are the ACME directories serve's
// -acme-directory defaults to and is usually set to for a trial.
const (
	LetsEncrypt        = certmagic.LetsEncryptProductionCA
	LetsEncryptStaging = certmagic.LetsEncryptStagingCA
)

// ACME configures obtaining certificates from an ACME directory (RFC 8555).
type ACME struct {
	// Directory is the directory URL; Email the account's contact (using
	// it agrees to the CA's terms).
	Directory, Email string
	// Roots, when set, are the only CAs trusted for the directory's own
	// TLS (a test CA such as Pebble); nil trusts the system's.
	Roots *x509.CertPool
	// Profile asks the CA for a certificate profile (draft-aaron-acme-
	// profiles); "" is the CA's default.
	Profile string
	// HTTPPort is the gateway's HTTP port, where HTTP-01 challenges are
	// answered (the CA asks port 80: map it there); TLSPort its HTTPS
	// port, for TLS-ALPN-01 (the CA asks 443). 0 turns that challenge
	// off. ListenHost is the host both listen on ("" for all).
	HTTPPort, TLSPort int
	ListenHost        string
	// NoHTTP01 and NoTLSALPN01 turn a challenge type off (for example
	// HTTP-01 where port 80 of the names does not reach the gateway).
	NoHTTP01, NoTLSALPN01 bool
	// RenewCheckInterval is how often held certificates are checked for
	// renewal (0: DefaultRenewCheckInterval).
	RenewCheckInterval time.Duration
}

// Config configures a Manager.
type Config struct {
	// Consul holds the operator's certificates (TLSSecretsPrefix) and the
	// ACME storage and locks; nil serves files only.
	Consul *consulroute.Client
	// Replica names this replica (the holder of its locks).
	Replica string
	// Files are certificates given as files, first in precedence. The
	// first one also answers clients that send no server name.
	Files []FilePair
	// ACME, when set, obtains a certificate for every routed name no file
	// or Consul certificate covers.
	ACME *ACME
	// Logger and Registerer: nil discards logs, and registers metrics
	// nowhere.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
	// Now is the clock (time.Now when nil).
	Now func() time.Time

	// issuer replaces the ACME issuer (tests: a CA in the test that
	// counts its orders).
	issuer certmagic.Issuer
}

// Name is a host the gateway routes, and what it routes to.
type Name struct {
	Host, Service, Namespace string
	// Internal: the name is an internal service's (visibility =
	// "internal"), routed on the gateway's internal listener only, which
	// has no HTTPS. ACME never orders it: an order would publish the name
	// in the CA's certificate transparency logs, and the public HTTPS
	// port answers it as a name nobody routes anyway.
	Internal bool
}

// Manager gives the gateway's HTTPS listener its certificates: it selects
// one for each handshake by precedence (files, then the operator's
// certificates in Consul KV, then ACME), keeps an ACME certificate for
// every routed name nothing else covers (ordered once for the cluster,
// renewed at a third of its validity left or when the CA's renewal
// information says), answers ACME challenges, and reports each name's
// certificate.
//
// A handshake for a name no certificate covers yet is refused at once
// with the TLS alert unrecognized_name: it neither waits for an order
// (which starts when the name is routed, not at its first request) nor
// gets a certificate for another name.
type Manager struct {
	cfg   Config
	now   func() time.Time
	log   *slog.Logger
	files atomic.Pointer[index]
	// secrets are the operator's certificates in Consul KV.
	secrets atomic.Pointer[index]
	// acmeNames are the names handed to certmagic, read on every
	// handshake; replaced whole under mu.
	acmeNames atomic.Pointer[map[string]bool]
	stamps    []fileStamp // the files' stamps when read; Run's

	// ACME: nil without it.
	magic   *certmagic.Config
	cache   *certmagic.Cache
	issuer  *certmagic.ACMEIssuer
	locks   *consulroute.Mutexes
	metrics *metrics

	mu       sync.Mutex
	names    map[string]Name               // routed, by host
	managing map[string]context.CancelFunc // names handed to certmagic
	failures map[string]failure            // the last ACME failure of each name
	runCtx   context.Context               // Run's; nil before Run
	// secretErrs are the KV keys whose value did not parse, with the
	// index that did not (said once per change).
	secretErrs map[string]uint64
}

type failure struct {
	err string
	at  time.Time
}

// New loads the files and sets up ACME. Run must run for Consul's
// certificates to be followed and ACME names to be ordered.
func New(cfg Config) (*Manager, error) {
	if cfg.ACME != nil && cfg.Consul == nil {
		return nil, errors.New("certificates: ACME needs Consul (the account and certificates are kept in its KV)")
	}
	if cfg.Replica == "" {
		cfg.Replica = "gateway"
	}
	m := &Manager{
		cfg: cfg, now: cfg.Now, log: cfg.Logger,
		names: map[string]Name{}, managing: map[string]context.CancelFunc{},
		failures: map[string]failure{}, secretErrs: map[string]uint64{},
	}
	if m.now == nil {
		m.now = time.Now
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.log = m.log.With("component", "certificates")
	files, stamps, err := loadFiles(cfg.Files)
	if err != nil {
		return nil, fmt.Errorf("certificates: %w", err)
	}
	m.files.Store(newIndex(files))
	m.stamps = stamps
	m.secrets.Store(newIndex(nil))
	m.acmeNames.Store(&map[string]bool{})
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	if m.metrics, err = newMetrics(reg, m); err != nil {
		return nil, fmt.Errorf("certificates: register metrics: %w", err)
	}
	if cfg.ACME != nil {
		if err := m.setupACME(*cfg.ACME); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *Manager) setupACME(a ACME) error {
	if a.Directory == "" || a.Email == "" {
		return errors.New("certificates: ACME needs a directory URL and an email")
	}
	if m.cfg.issuer == nil && (a.HTTPPort == 0 || a.NoHTTP01) && (a.TLSPort == 0 || a.NoTLSALPN01) {
		return errors.New("certificates: ACME needs a challenge type: HTTP-01 and TLS-ALPN-01 are both off")
	}
	locks, err := m.cfg.Consul.NewMutexes(consulroute.TLSKVPrefix+"locks/", m.cfg.Replica)
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	storage, err := NewStorage(m.cfg.Consul, consulroute.TLSStorePrefix, locks)
	if err != nil {
		return err
	}
	check := a.RenewCheckInterval
	if check <= 0 {
		check = DefaultRenewCheckInterval
	}
	zl := zapToSlog(m.log)
	m.locks = locks
	m.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return m.magic, nil },
		RenewCheckInterval: check,
		Logger:             zl,
	})
	m.magic = certmagic.New(m.cache, certmagic.Config{
		RenewalWindowRatio: RenewalWindowRatio,
		Storage:            storage,
		Logger:             zl,
		OnEvent:            m.onEvent,
		ShouldEmitFunc:     func(event string) bool { return event == "cert_obtained" || event == "cert_failed" },
		// Not nil, or New adds Let's Encrypt; set below.
		Issuers: []certmagic.Issuer{},
	})
	// The challenge solvers certmagic would start on these ports find them
	// taken by the gateway's listeners and leave the answers to them
	// (ServeChallenge, and GetCertificate for TLS-ALPN-01); the challenge
	// is written to the shared storage first, so whichever replica the
	// CA reaches answers it.
	m.issuer = certmagic.NewACMEIssuer(m.magic, certmagic.ACMEIssuer{
		CA:                      a.Directory,
		Email:                   a.Email,
		Agreed:                  true,
		Profile:                 a.Profile,
		TrustedRoots:            a.Roots,
		AltHTTPPort:             a.HTTPPort,
		AltTLSALPNPort:          a.TLSPort,
		ListenHost:              a.ListenHost,
		DisableHTTPChallenge:    a.HTTPPort == 0 || a.NoHTTP01,
		DisableTLSALPNChallenge: a.TLSPort == 0 || a.NoTLSALPN01,
		Logger:                  zl,
	})
	m.magic.Issuers = []certmagic.Issuer{m.issuer}
	if m.cfg.issuer != nil {
		m.magic.Issuers = []certmagic.Issuer{m.cfg.issuer}
	}
	m.cfg.ACME = &a
	m.cfg.ACME.RenewCheckInterval = check
	return nil
}

// Run follows the operator's certificates in Consul and the files, and
// orders and renews ACME certificates, until ctx ends; then it stops
// renewing and releases its locks.
func (m *Manager) Run(ctx context.Context) error {
	m.mu.Lock()
	m.runCtx = ctx
	m.reconcileLocked()
	m.mu.Unlock()
	var wg sync.WaitGroup
	if m.cfg.Consul != nil {
		wg.Go(func() {
			_ = m.cfg.Consul.WatchKVPrefix(ctx, consulroute.TLSSecretsPrefix, m.setSecrets)
		})
	}
	if len(m.cfg.Files) > 0 {
		wg.Go(func() {
			t := time.NewTicker(fileCheckInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					m.reloadFiles()
				}
			}
		})
	}
	<-ctx.Done()
	wg.Wait()
	if m.cache != nil {
		m.cache.Stop()
	}
	if m.locks != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := m.locks.Close(cctx); err != nil {
			m.log.Warn("release certificate locks", "err", err)
		}
	}
	return nil
}

// fileCheckInterval is how often the files are looked at for a new
// certificate (a renewal by whatever wrote them).
const fileCheckInterval = time.Minute

// reloadFiles reads the files again when one changed. A pair that no
// longer loads keeps the certificate last read (and says why).
func (m *Manager) reloadFiles() {
	changed := false
	for i, p := range m.cfg.Files {
		for j, f := range []string{p.Cert, p.Key} {
			if s, err := stampOf(f); err == nil && s != m.stamps[2*i+j] {
				changed = true
			}
		}
	}
	if !changed {
		return
	}
	certs, stamps, err := loadFiles(m.cfg.Files)
	if err != nil {
		m.log.Error("a certificate file changed and does not load; serving the certificates read before", "err", err)
		return
	}
	m.stamps = stamps
	m.files.Store(newIndex(certs))
	m.log.Info("certificate files reloaded", "files", len(certs))
	m.reconcile()
}

// setSecrets takes the operator's certificates from KV. A value that does
// not parse is skipped (and said once per change of it).
func (m *Manager) setSecrets(entries []consulroute.KVEntry) {
	certs := make([]*cert, 0, len(entries))
	m.mu.Lock()
	seen := map[string]bool{}
	for _, e := range entries {
		seen[e.Key] = true
		c, err := parseBundle(e.Value, e.Key)
		if err != nil {
			if idx, ok := m.secretErrs[e.Key]; !ok || idx != e.ModifyIndex {
				m.secretErrs[e.Key] = e.ModifyIndex
				m.log.Error("a certificate in Consul does not load; skipped", "key", e.Key, "err", err)
			}
			continue
		}
		delete(m.secretErrs, e.Key)
		certs = append(certs, c)
	}
	for k := range m.secretErrs {
		if !seen[k] {
			delete(m.secretErrs, k)
		}
	}
	m.secrets.Store(newIndex(certs))
	m.reconcileLocked()
	m.mu.Unlock()
}

// SetNames gives the hosts the gateway routes now: ACME certificates are
// ordered for new ones (nothing else covering them) and no longer kept
// for those gone (their certificates stay in storage, and are used again
// if the name comes back before they expire).
func (m *Manager) SetNames(names []Name) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.names = make(map[string]Name, len(names))
	for _, n := range names {
		n.Host = normalName(n.Host)
		if n.Host != "" {
			m.names[n.Host] = n
		}
	}
	m.reconcileLocked()
}

func (m *Manager) reconcile() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.reconcileLocked()
}

// reconcileLocked hands certmagic the names ACME is for, and takes back
// the others (call with mu held).
func (m *Manager) reconcileLocked() {
	if m.magic == nil || m.runCtx == nil {
		return
	}
	var add []string
	for host, n := range m.names {
		if _, ok := m.managing[host]; !ok && m.acmeEligible(n) == "" {
			add = append(add, host)
		}
	}
	var remove []certmagic.SubjectIssuer
	for host, cancel := range m.managing {
		if n, routed := m.names[host]; !routed || m.acmeEligible(n) != "" {
			cancel()
			delete(m.managing, host)
			remove = append(remove, certmagic.SubjectIssuer{Subject: host})
		}
	}
	slices.Sort(add)
	for _, host := range add {
		// One context per name, so a name that goes away stops its order
		// in flight too.
		ctx, cancel := context.WithCancel(m.runCtx)
		m.managing[host] = cancel
		if err := m.magic.ManageAsync(ctx, []string{host}); err != nil {
			m.log.Error("start obtaining a certificate", "name", host, "err", err)
		}
	}
	if len(remove) > 0 {
		m.cache.RemoveManaged(remove)
	}
	if len(add)+len(remove) > 0 {
		names := make(map[string]bool, len(m.managing))
		for h := range m.managing {
			names[h] = true
		}
		m.acmeNames.Store(&names)
		m.log.Debug("ACME names changed", "added", add, "removed", len(remove), "managed", len(names))
	}
}

// acmeEligible says why a routed name gets no ACME certificate, or ""
// when it does.
func (m *Manager) acmeEligible(n Name) string {
	host := n.Host
	switch {
	case n.Internal:
		return "an internal service's name (served on the internal listener only, without HTTPS); ACME orders none for it"
	case m.files.Load().covers(host):
		return "covered by a certificate file"
	case m.secrets.Load().covers(host):
		return "covered by a certificate in Consul"
	case !certmagic.SubjectQualifiesForPublicCert(host):
		return "not a public DNS name"
	}
	return ""
}

// onEvent records certmagic's outcomes: an order or renewal done or
// failed, on this replica.
func (m *Manager) onEvent(_ context.Context, event string, data map[string]any) error {
	name, _ := data["identifier"].(string)
	renewal, _ := data["renewal"].(bool)
	kind := "obtain"
	if renewal {
		kind = "renew"
	}
	switch event {
	case "cert_obtained":
		m.metrics.orders.WithLabelValues(kind, "ok").Inc()
		m.mu.Lock()
		delete(m.failures, name)
		m.mu.Unlock()
		m.log.Info("certificate obtained", "name", name, "renewal", renewal, "issuer", data["issuer"])
	case "cert_failed":
		m.metrics.orders.WithLabelValues(kind, "error").Inc()
		msg := "unknown error"
		if err, ok := data["error"].(error); ok && err != nil {
			msg = err.Error()
		}
		m.mu.Lock()
		m.failures[name] = failure{err: msg, at: m.now()}
		m.mu.Unlock()
		m.log.Warn("obtaining a certificate failed; retrying with backoff (a certificate still valid keeps being served)", "name", name, "renewal", renewal, "err", msg)
	}
	return nil
}

// TLSConfig is the HTTPS listener's configuration: TLS 1.2 and later
// with Go's default cipher suites and curves, session tickets on (Go
// rotates their keys), ALPN offering h2 and http/1.1 (and acme-tls/1,
// which only an ACME server validating TLS-ALPN-01 asks for), and a
// certificate from GetCertificate.
func (m *Manager) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		NextProtos:     []string{"h2", "http/1.1", acmez.ACMETLS1Protocol},
		GetCertificate: m.GetCertificate,
	}
}

// GetCertificate selects the certificate for a handshake: the TLS-ALPN-01
// challenge's when an ACME server validates; otherwise by the server name,
// from the files, then the operator's certificates in Consul, then ACME.
// Without a server name the first file's certificate answers. None:
// (nil, nil), which crypto/tls answers with the alert unrecognized_name.
func (m *Manager) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if m.magic != nil && len(hello.SupportedProtos) == 1 && hello.SupportedProtos[0] == acmez.ACMETLS1Protocol {
		return m.magic.GetCertificate(hello)
	}
	name := normalName(hello.ServerName)
	if name == "" {
		if c := m.files.Load().first; c != nil {
			return c.tls, nil
		}
		m.metrics.refused.Inc()
		return nil, nil
	}
	if c := m.select1(name, m.now()); c != nil {
		return c.tls, nil
	}
	// From certmagic's cache alone: its own GetCertificate would look in
	// storage for a name it does not hold, on every handshake.
	if c := m.acmeCert(name, m.now()); c != nil {
		return c.tls, nil
	}
	m.metrics.refused.Inc()
	return nil, nil
}

// select1 is the certificate of the first source that covers name.
func (m *Manager) select1(name string, now time.Time) *cert {
	if c := m.files.Load().lookup(name, now); c != nil {
		return c
	}
	return m.secrets.Load().lookup(name, now)
}

// acmeCert is the certificate certmagic holds for name, if any.
func (m *Manager) acmeCert(name string, now time.Time) *cert {
	if m.cache == nil || !(*m.acmeNames.Load())[name] {
		return nil
	}
	var cs []*cert
	for _, c := range m.cache.AllMatchingCertificates(name) {
		if c.Leaf != nil {
			tc := c.Certificate
			cs = append(cs, &cert{tls: &tc, leaf: c.Leaf, source: SourceACME, origin: m.cfg.ACME.Directory})
		}
	}
	return best(cs, now)
}

// HasCertificate reports whether a handshake for host would get a
// certificate valid now (the gateway redirects plain HTTP to HTTPS only
// then).
func (m *Manager) HasCertificate(host string) bool {
	host = normalName(host)
	now := m.now()
	c := m.select1(host, now)
	if c == nil {
		c = m.acmeCert(host, now)
	}
	return c != nil && c.validAt(now)
}

// ServeChallenge answers an ACME HTTP-01 challenge request (GET
// /.well-known/acme-challenge/<token>) and reports whether r was one. The
// token may have been put in storage by another replica.
func (m *Manager) ServeChallenge(w http.ResponseWriter, r *http.Request) bool {
	if m.issuer == nil {
		return false
	}
	return m.issuer.HandleHTTPChallenge(w, r)
}

// ChallengePathPrefix is where HTTP-01 challenges are asked.
const ChallengePathPrefix = "/.well-known/acme-challenge/"

// AdminPath is where serve's admin API lists the routed names and their
// certificates ([]NameStatus, JSON).
const AdminPath = "/v1/tls/certificates"

// NameStatus is one routed name's certificate, as `status` shows it.
type NameStatus struct {
	Name      string `json:"name"`
	Service   string `json:"service"`
	Namespace string `json:"namespace"`
	// State: "valid", "expired", "not yet valid", "ordering" (ACME has
	// none for it yet) or "none" (nothing covers it; Note says why).
	State  string `json:"state"`
	Source Source `json:"source,omitempty"`
	// Origin is the file, the KV key or the ACME directory.
	Origin    string    `json:"origin,omitempty"`
	Issuer    string    `json:"issuer,omitempty"`
	NotBefore time.Time `json:"not_before,omitzero"`
	NotAfter  time.Time `json:"not_after,omitzero"`
	// RenewBy is when an ACME certificate is renewed at the latest (a
	// third of its validity left; the CA's renewal information may make
	// it sooner).
	RenewBy time.Time `json:"renew_by,omitzero"`
	// LastError is this replica's last failed order or renewal of the
	// name since its last success.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
	Note        string    `json:"note,omitempty"`
	Replica     string    `json:"replica,omitempty"`
}

// Status reports every routed name's certificate, sorted by name.
func (m *Manager) Status() []NameStatus {
	now := m.now()
	m.mu.Lock()
	names := make([]Name, 0, len(m.names))
	for _, n := range m.names {
		names = append(names, n)
	}
	failures := make(map[string]failure, len(m.failures))
	for k, v := range m.failures {
		failures[k] = v
	}
	m.mu.Unlock()
	slices.SortFunc(names, func(a, b Name) int { return strings.Compare(a.Host, b.Host) })
	out := make([]NameStatus, 0, len(names))
	for _, n := range names {
		s := NameStatus{Name: n.Host, Service: n.Service, Namespace: n.Namespace, Replica: m.cfg.Replica}
		c := m.select1(n.Host, now)
		if c == nil {
			c = m.acmeCert(n.Host, now)
		}
		if f, ok := failures[n.Host]; ok {
			s.LastError, s.LastErrorAt = f.err, f.at
		}
		switch {
		case c != nil:
			s.Source, s.Origin = c.source, c.origin
			s.Issuer = issuerName(c.leaf)
			s.NotBefore, s.NotAfter = c.leaf.NotBefore, c.leaf.NotAfter
			switch {
			case now.Before(c.leaf.NotBefore):
				s.State = "not yet valid"
			case now.After(c.leaf.NotAfter):
				s.State = "expired"
			default:
				s.State = "valid"
			}
			if c.source == SourceACME {
				s.RenewBy = Renewal{NotBefore: c.leaf.NotBefore, NotAfter: c.leaf.NotAfter, CheckInterval: m.cfg.ACME.RenewCheckInterval}.At()
			}
		case m.magic != nil && (*m.acmeNames.Load())[n.Host]:
			s.State, s.Source, s.Origin = "ordering", SourceACME, m.cfg.ACME.Directory
		default:
			s.State = "none"
			if m.magic == nil {
				s.Note = "no certificate covers it and ACME is off (serve -acme-email)"
			} else {
				s.Note = "no certificate covers it and ACME does not order it: " + m.acmeEligible(n)
			}
		}
		out = append(out, s)
	}
	return out
}

// issuerName is how a certificate's issuer is shown: its common name, or
// its organization.
func issuerName(leaf *x509.Certificate) string {
	if cn := leaf.Issuer.CommonName; cn != "" {
		return cn
	}
	if len(leaf.Issuer.Organization) > 0 {
		return leaf.Issuer.Organization[0]
	}
	return leaf.Issuer.String()
}
