package controlplane

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// Config is what one replica of the control plane runs with. Run checks it.
type Config struct {
	// Listen is the gateway's address (user traffic), AdminListen the
	// admin API's (health, metrics, autoscaler state).
	Listen, AdminListen string
	// Sockets is the unix socket of a SocketKeeper holding the gateway's
	// listening sockets (and HTTPS's) for this serve; "": serve binds
	// them itself.
	Sockets string
	// Advertise is the IP other nodes reach this replica at, registered
	// in Consul; "" is the Listen host, or the Consul agent's address when
	// that is a wildcard.
	Advertise string
	// Domain: services answer at <service>.<namespace>.<Domain>.
	Domain string
	// HTTPS configures the gateway's HTTPS port (tls.go); its zero value
	// serves none.
	HTTPS HTTPS
	// InternalListen is the address of the gateway's internal listener
	// (plain HTTP/1.1 and h2c), where every service is served, internal
	// ones (visibility = "internal") included; "" opens none, and
	// internal services are then reachable through the mesh only. Bind
	// it to the node's private address: it is what other services of
	// the cluster call.
	InternalListen string
	// Replica is this replica's name, unique among the replicas. Consul
	// must carry the same (consulroute.WithReplica): stand-ins, the
	// activator registration and the leader lock are named after it.
	Replica string
	// Tick is the autoscaler's decision period (0: the autoscaler's
	// default).
	Tick time.Duration
	// Nomad and Consul are the clients every part goes through.
	Nomad  *nomadjob.Client
	Consul *consulroute.Client
	// Logger gets every part's log; nil discards it.
	Logger *slog.Logger
	// Tracing, if set, traces the gateway's requests and wakes; its span
	// queue's counters join the control plane's metrics.
	Tracing *tracing.Provider
}

// check says what is wrong with c, and fills in the logger.
func (c *Config) check() error {
	var errs []error
	if c.Nomad == nil {
		errs = append(errs, errors.New("Config.Nomad is nil: give it the Nomad client"))
	}
	if c.Consul == nil {
		errs = append(errs, errors.New("Config.Consul is nil: give it the Consul client"))
	}
	if c.Replica == "" {
		errs = append(errs, errors.New("Config.Replica is empty: name this replica"))
	} else if c.Consul != nil && c.Consul.Replica() != c.Replica {
		errs = append(errs, fmt.Errorf("Config.Replica is %q but the Consul client's replica is %q: build it with consulroute.WithReplica(%q)", c.Replica, c.Consul.Replica(), c.Replica))
	}
	if c.Tick < 0 {
		errs = append(errs, fmt.Errorf("Config.Tick %s is negative", c.Tick))
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	return nil
}

// Run runs the control plane until ctx ends, then leaves in order: the
// leader lock first, then the activator registration, then the listeners,
// letting requests in flight finish. It returns the first error a part
// could not go on from.
func Run(ctx context.Context, c Config) error {
	if err := c.check(); err != nil {
		return err
	}
	nomad, consul, log := c.Nomad, c.Consul, c.Logger

	ls, err := listen(ctx, c)
	if err != nil {
		return err
	}
	defer ls.close()
	gwPort, adminPort := ls.gatewayPort(), ls.adminPort()
	advertise, err := advertiseAddress(c, consul)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	if c.Tracing != nil {
		for _, col := range c.Tracing.Collectors() {
			if err := reg.Register(col); err != nil {
				return fmt.Errorf("registering the tracing metrics: %w", err)
			}
		}
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	keys, err := newAdminKeys(ctx, consul, log, reg)
	if err != nil {
		return err
	}
	cat := catalog.New()
	tags := newRevisionTags()
	// Scaling to zero registers this replica's stand-in first (make before
	// break for catalog-driven proxies).
	scaler := standInFirst{scaler: nomad, src: consul, cat: cat, tags: tags, addr: advertise, port: gwPort, log: log}
	var tracer trace.Tracer // nil: tracing off
	if c.Tracing != nil {
		tracer = c.Tracing.Tracer()
	}
	auto, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: scaler, Resources: nomadjob.NewUsageReader(nomad),
		Tick: c.Tick, Logger: log, Registerer: reg, Tracer: tracer})
	if err != nil {
		return err
	}
	leader := &leaderAddress{}
	sink, err := autoscaler.NewRemoteSink(autoscaler.RemoteSinkConfig{Leader: leader.get, Local: auto, Client: keys.client, Logger: log})
	if err != nil {
		return err
	}
	// Every replica wakes a revision at zero itself (and tells the leader):
	// a wake never waits for leadership to move.
	waker, err := autoscaler.NewWaker(autoscaler.WakerConfig{Revisions: cat, Raiser: nomad, Next: sink, Local: auto, Logger: log, Tracer: tracer})
	if err != nil {
		return err
	}
	certificates, err := newCertificates(c, consul, ls, reg, log)
	if err != nil {
		return err
	}
	// The catalog is in once Nomad's revisions are listed and Consul's
	// routes and ready instances joined to them; until then the gateway
	// holds what it cannot route, then refuses it with 503 and
	// Retry-After, rather than answer 404 for a service it has not loaded.
	listed, recordsLoaded, readyJoined := make(chan struct{}), make(chan struct{}), make(chan struct{})
	catalogIn := make(chan struct{})
	gwc := activator.Config{Catalog: cat, Autoscaler: waker, Domain: c.Domain, Replica: c.Replica, Logger: log, Registerer: reg,
		WakeRecorder: wakeRecorder{nomad}, Loaded: catalogIn, Tracing: c.Tracing}
	if certificates != nil {
		gwc.TLS, gwc.HTTPSPort = certificates, ls.httpsPort()
	}
	gw, err := activator.New(gwc)
	if err != nil {
		return err
	}
	rolloutMetrics, err := newRolloutMetrics(reg)
	if err != nil {
		return err
	}
	rollouts, err := newRolloutDriver(rolloutDriverConfig{Consul: consul, Nomad: nomad, Catalog: cat,
		Measure: auto.TakeMeasurements, Metrics: rolloutMetrics, Logger: log})
	if err != nil {
		return err
	}
	admin, err := adminHandler(gw, auto, keys.verifier, certificates)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var fatal atomic.Pointer[error]
	goRun := func(name string, f func(ctx context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				err = fmt.Errorf("%s: %w", name, err)
				fatal.CompareAndSwap(nil, &err)
				cancel()
			}
		}()
	}

	goRun("catalog loaded", func(ctx context.Context) error {
		for _, ch := range []chan struct{}{listed, recordsLoaded, readyJoined} {
			select {
			case <-ch:
			case <-ctx.Done():
				return nil
			}
		}
		close(catalogIn)
		return nil
	})
	goRun("follow Nomad", func(ctx context.Context) error {
		return feedNomad(ctx, nomad, cat, tags, gw, func() { close(listed) }, log)
	})
	goRun("follow Consul records", func(ctx context.Context) error {
		return feedRecords(ctx, consul, cat, func() { close(recordsLoaded) }, log)
	})
	goRun("follow ready instances", func(ctx context.Context) error {
		return feedReady(ctx, consul, cat, listed, func() { close(readyJoined) }, log)
	})
	// The leader lock's session is bound to this replica's activator check
	// (its admin /healthz), so a replica that dies loses the lock within a
	// check interval. On the way out the lock is released first: the
	// gateway turning unhealthy, or the activator's deregistration, would
	// end the session with Consul's lock delay instead.
	released := make(chan struct{})
	goRun("gateway", func(ctx context.Context) error { return gw.Run(untilReleased(ctx, released)) })
	goRun("autoscaler link", sink.Run)
	goRun("leader election", func(ctx context.Context) error {
		defer close(released)
		lock := consul.NewLock(consulroute.AutoscalerLockKey, c.Replica, consulroute.LockTTL,
			consulroute.WithSessionCheck(spec.ActivatorServiceName, consul.ActivatorCheckID("")))
		return autoscaler.RunWhenLeader(ctx, lock, func(ctx context.Context) error {
			// The rollouts are driven beside the autoscaler, on its
			// measurements, for exactly as long as it leads.
			done, reaped := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				waitLeading(ctx, auto)
				_ = rollouts.Run(ctx)
			}()
			// The leader removes what dead replicas left in Consul.
			go func() {
				defer close(reaped)
				reapDeadReplicas(ctx, consul, c.Replica, reapEvery, reapGrace, log)
			}()
			err := auto.Run(ctx)
			<-done
			<-reaped
			return err
		}, log)
	})
	goRun("leader lookup", func(ctx context.Context) error { leader.follow(ctx, consul, log); return nil })
	goRun("follow the admin API keyring", func(ctx context.Context) error { return keys.follow(ctx, consul) })
	// Stand-ins start once Nomad's revisions are listed (before that every
	// stand-in looks unwanted) and this replica's activator is registered
	// (the leader's reaper finds a dead replica's stand-ins by it).
	registered := make(chan struct{})
	sweepStandIns := make(chan struct{}, 1)
	goRun("activator stand-ins", func(ctx context.Context) error {
		for _, ch := range []chan struct{}{listed, registered} {
			select {
			case <-ctx.Done():
				return nil
			case <-ch:
			}
		}
		keepStandIns(ctx, consul, cat, tags, advertise, gwPort, sweepStandIns, log)
		return nil
	})

	ls.serveWith(gw, admin)
	goRun("gateway listener", func(ctx context.Context) error {
		awaitCatalog(ctx, catalogLoadWait, log, listed, recordsLoaded, readyJoined)
		return ls.serveGateway()
	})
	goRun("admin listener", func(context.Context) error { return ls.serveAdmin() })
	goRun("gateway internal listener", func(ctx context.Context) error {
		awaitCatalog(ctx, catalogLoadWait, log, listed, recordsLoaded, readyJoined)
		return ls.serveInternal()
	})
	if certificates != nil {
		ls.serveHTTPSWith(gw, certificates.TLSConfig())
		goRun("certificates", certificates.Run)
		goRun("certificate names", func(ctx context.Context) error {
			followCertificateNames(ctx, cat, gw, certificates)
			return nil
		})
		goRun("gateway HTTPS listener", func(ctx context.Context) error {
			awaitCatalog(ctx, catalogLoadWait, log, listed, recordsLoaded, readyJoined)
			return ls.serveHTTPS()
		})
	}

	self := consulroute.ActivatorRegistration{Address: advertise, Port: gwPort, AdminPort: adminPort, Domain: c.Domain, HTTPSPort: ls.httpsPort()}
	if port := ls.internalPort(); port != 0 {
		self.InternalAddress, self.InternalPort = internalAddress(c.InternalListen, advertise), port
	}
	if err := consul.RegisterActivator(ctx, self); err != nil {
		cancel()
		wg.Wait()
		return fmt.Errorf("register in Consul as %s: %w", spec.ActivatorServiceName, err)
	}
	close(registered)
	// Its end is waited for before the deregistration below, so a
	// registration it had under way cannot land after it.
	kept := make(chan struct{})
	lostRegistrations := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "nomad_serverless_activator_registrations_lost_total",
		Help: "Times the local Consul agent had lost this replica's activator registration (reaped after its check stayed critical, or an agent restarted without its state) and serve registered it again.",
	})
	reg.MustRegister(lostRegistrations)
	goRun("keep the activator registered", func(ctx context.Context) error {
		defer close(kept)
		keepActivatorRegistered(ctx, consul, self, activatorCheckEvery, func() {
			lostRegistrations.Inc()
			select {
			case sweepStandIns <- struct{}{}:
			default: // a sweep is already due
			}
		}, log)
		return nil
	})
	log.Info("serving", "gateway", ls.gateway.Addr().String(), "https", ls.httpsPort(), "internal", ls.internalPort(), "admin", ls.admin.Addr().String(), "advertise", advertise, "domain", c.Domain)

	<-ctx.Done()
	// Leave the load balancer first, then stop taking requests, then let
	// in-flight ones finish.
	stop, stopCancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer stopCancel()
	select {
	case <-released:
	case <-stop.Done():
	}
	select {
	case <-kept:
	case <-stop.Done():
	}
	if err := consul.DeregisterActivator(stop, ""); err != nil {
		log.Warn("deregister from Consul", "err", err)
	}
	ls.shutdown(stop)
	wg.Wait()
	if p := fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// catalogLoadWait bounds how long a starting serve keeps its gateway's
// connections waiting for the catalog (awaitCatalog). A healthy cluster
// loads it in milliseconds; past this the gateway serves what it can
// route, and holds (activator.Config.Loaded) or refuses with 503 and
// Retry-After what it cannot, never 404, until the catalog is in.
const catalogLoadWait = 10 * time.Second

// awaitCatalog returns once every one of loaded is closed (Nomad's
// revisions listed, Consul's routes and ready instances joined to them),
// after wait, or when ctx ends. A starting serve takes no request before:
// the kernel holds the connections made meanwhile in the listening
// socket's backlog, and they are served once the gateway knows the
// cluster. Otherwise a restarted serve answered its first requests from a
// catalog still loading: 404 for a service that exists, 503 for a
// revision it has not learned of yet (69 and 283 of them in one run of
// e2e scenario 7, none since; issue 45 saw it wait its full 10 s at 2,800
// revisions, which the gateway's own hold now covers).
func awaitCatalog(ctx context.Context, wait time.Duration, log *slog.Logger, loaded ...<-chan struct{}) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, ch := range loaded {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-t.C:
			log.Warn("the gateway takes requests before the catalog has loaded: Nomad or Consul is slow to answer; a request for a service not loaded yet is held until it is, then refused with 503 and Retry-After", "waited", wait, "hold", activator.DefaultLoadingHold)
			return
		}
	}
}

// untilReleased is ctx, except that it ends only once the leader lock is
// released as well (at most 5 s later): see Run.
func untilReleased(ctx context.Context, released <-chan struct{}) context.Context {
	out, cancel := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		<-ctx.Done()
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-released:
		case <-t.C:
		}
		cancel()
	}()
	return out
}

// internalAddress is the IP registered in Consul for the internal
// listener on listen: its host, or advertise when that is a wildcard.
func internalAddress(listen, advertise string) string {
	host, _, err := net.SplitHostPort(listen)
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		return advertise
	}
	return host
}

// advertiseAddress is the IP registered in Consul for this replica. Its
// errors name serve's flags: that is where a user sets these.
func advertiseAddress(c Config, consul *consulroute.Client) (string, error) {
	if c.Advertise != "" {
		return c.Advertise, nil
	}
	host, _, err := net.SplitHostPort(c.Listen)
	if err != nil {
		return "", fmt.Errorf("-listen %q: %w", c.Listen, err)
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		return host, nil
	}
	self, err := consul.API().Agent().Self()
	if err == nil {
		if member, ok := self["Member"]; ok {
			if addr, ok := member["Addr"].(string); ok && addr != "" {
				return addr, nil
			}
		}
	}
	return "", errors.New("-listen is a wildcard address and the Consul agent's address is unknown: give -advertise IP")
}
