package autoscaler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// RemoteSinkConfig configures a RemoteSink. Leader is required.
type RemoteSinkConfig struct {
	// Leader returns the leader's admin API address ("10.0.0.5:4647" or
	// "http://10.0.0.5:4647"); ok is false while no leader is known.
	Leader func() (addr string, ok bool)
	// Local, when set, is this replica's own autoscaler: while it leads,
	// calls go to it in process instead of over HTTP.
	Local *Autoscaler
	// Client talks to the leader. The leader refuses writes that are not
	// signed by a control-plane replica, so serve gives it one whose
	// transport signs (adminauth.Transport). nil gets a plain client with a
	// 2s timeout, for servers that check nothing (tests).
	Client *http.Client
	// Poll is how often the burst capacities are fetched; default 1s.
	Poll time.Duration
	// Stale is the age after which fetched capacities count as unknown;
	// default 3 polls.
	Stale time.Duration
	// Now is the clock; nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// RemoteSink is the DemandSink (and excess-burst-capacity source) of a
// replica that may not lead: it forwards reports and wakes to the leader's
// admin API and caches the leader's burst capacities, polled every Poll.
// ExcessBurstCapacity is lock-free (an atomic pointer to an immutable
// snapshot) because the gateway asks on every request; a snapshot older
// than Stale reads as unknown, so a lost leader never leaves stale
// "plenty of capacity" answers behind.
type RemoteSink struct {
	cfg   RemoteSinkConfig
	log   *slog.Logger
	cache atomic.Pointer[ebcSnapshot]

	wakeMu sync.Mutex
	waking map[string]bool // revisions with a wake in flight to the leader
}

type ebcSnapshot struct {
	expires int64 // unix nanoseconds
	ebc     map[string]float64
}

// NewRemoteSink validates cfg.
func NewRemoteSink(cfg RemoteSinkConfig) (*RemoteSink, error) {
	if cfg.Leader == nil {
		return nil, errors.New("autoscaler: RemoteSinkConfig.Leader is nil: give it a func returning the leader's admin address")
	}
	if cfg.Poll < 0 || cfg.Stale < 0 {
		return nil, errors.New("autoscaler: RemoteSinkConfig Poll and Stale must not be negative")
	}
	if cfg.Poll == 0 {
		cfg.Poll = time.Second
	}
	if cfg.Stale == 0 {
		cfg.Stale = 3 * cfg.Poll
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 2 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &RemoteSink{cfg: cfg, log: log.With("component", "autoscaler-remote"), waking: map[string]bool{}}, nil
}

func (r *RemoteSink) local() *Autoscaler {
	if l := r.cfg.Local; l != nil && l.Leading() {
		return l
	}
	return nil
}

// errNoLeader: no replica holds the autoscaler lock, or none is known yet.
var errNoLeader = errors.New("no autoscaler leader is known yet")

// leaderlessWarnAfter is how long no leader may be known before RemoteSink
// warns: an election takes a few seconds (a dead leader's session ends with
// its activator check, then a 1 s lock delay; consulroute.LockDelay), so
// half a minute without one is worth a word.
const leaderlessWarnAfter = 30 * time.Second

func (r *RemoteSink) base() (string, error) {
	addr, ok := r.cfg.Leader()
	if !ok || addr == "" {
		return "", errNoLeader
	}
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	return strings.TrimSuffix(addr, "/"), nil
}

// ReportDemand implements DemandSink.
func (r *RemoteSink) ReportDemand(ctx context.Context, replica string, demand []Demand) error {
	if l := r.local(); l != nil {
		return l.ReportDemand(ctx, replica, demand)
	}
	if demand == nil {
		demand = []Demand{}
	}
	return r.post(ctx, PathDemand, DemandReport{Replica: replica, Demand: demand})
}

// Wake implements DemandSink. While a wake for the revision is on its way to
// the leader, further wakes for it return at once: the one in flight
// carries the news, and the next demand report the exact queue.
func (r *RemoteSink) Wake(ctx context.Context, replica string, d Demand) error {
	if l := r.local(); l != nil {
		return l.Wake(ctx, replica, d)
	}
	r.wakeMu.Lock()
	if r.waking[d.Revision] {
		r.wakeMu.Unlock()
		return nil
	}
	r.waking[d.Revision] = true
	r.wakeMu.Unlock()
	defer func() {
		r.wakeMu.Lock()
		delete(r.waking, d.Revision)
		r.wakeMu.Unlock()
	}()
	return r.post(ctx, PathWake, WakeRequest{Replica: replica, Demand: d})
}

func (r *RemoteSink) post(ctx context.Context, path string, body any) error {
	base, err := r.base()
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return fmt.Errorf("POST %s: %w", path, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(b))
	if err != nil {
		return fmt.Errorf("POST %s: %w", base+path, err)
	}
	req.Header.Set("Content-Type", "application/json")
	injectWakeTrace(ctx, req.Header)
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("POST %s: %w", base+path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s", base+path, errorBody(resp))
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// errorBody is an error answer's message.
func errorBody(resp *http.Response) string {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	var e adminError
	if json.Unmarshal(b, &e) == nil && e.Error != "" {
		return resp.Status + ": " + e.Error
	}
	return resp.Status + ": " + strings.TrimSpace(string(b))
}

// ExcessBurstCapacity is the leader's last published value for revision;
// known is false when it is not fresh (older than Stale) or not listed.
func (r *RemoteSink) ExcessBurstCapacity(revision string) (ebc float64, known bool) {
	if l := r.local(); l != nil {
		return l.ExcessBurstCapacity(revision)
	}
	s := r.cache.Load()
	if s == nil || r.cfg.Now().UnixNano() > s.expires {
		return 0, false
	}
	ebc, known = s.ebc[revision]
	return ebc, known
}

// Run fetches the leader's burst capacities every Poll until ctx ends, and
// returns nil then. Failures are logged and leave the cache to go stale.
func (r *RemoteSink) Run(ctx context.Context) error {
	t := time.NewTicker(r.cfg.Poll)
	defer t.Stop()
	failing := false
	var leaderless time.Time // since when no leader is known; zero when one is
	for {
		if r.local() == nil {
			err := r.refresh(ctx)
			if !errors.Is(err, errNoLeader) {
				leaderless = time.Time{}
			}
			switch {
			case err == nil:
				if failing {
					r.log.Info("reading burst capacities from the autoscaler leader again")
				}
				failing = false
			case errors.Is(err, errNoLeader):
				// Normal for a few seconds after start, while the replicas
				// elect one (often this one): the activator stays in the
				// path meanwhile. Worth a warning only when it lasts.
				now := r.cfg.Now()
				if leaderless.IsZero() {
					leaderless = now
				} else if !failing && now.Sub(leaderless) >= leaderlessWarnAfter && ctx.Err() == nil {
					r.log.Warn("no autoscaler leader yet: revisions scale only while a replica holds the Consul lock",
						"for", now.Sub(leaderless).Round(time.Second))
					failing = true
				}
			default:
				if !failing && ctx.Err() == nil {
					r.log.Warn("cannot read burst capacities from the autoscaler leader", "err", err)
				}
				failing = true
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// refresh fetches the burst capacities once.
func (r *RemoteSink) refresh(ctx context.Context) error {
	base, err := r.base()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.Poll)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+PathBurstCapacity, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", base+PathBurstCapacity, err)
	}
	resp, err := r.cfg.Client.Do(req)
	if err != nil {
		return fmt.Errorf("GET %s: %w", base+PathBurstCapacity, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", base+PathBurstCapacity, errorBody(resp))
	}
	var bc BurstCapacities
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAdminBody)).Decode(&bc); err != nil {
		return fmt.Errorf("GET %s: decode: %w", base+PathBurstCapacity, err)
	}
	if bc.Revisions == nil {
		bc.Revisions = map[string]float64{}
	}
	r.cache.Store(&ebcSnapshot{expires: r.cfg.Now().Add(r.cfg.Stale).UnixNano(), ebc: bc.Revisions})
	return nil
}
