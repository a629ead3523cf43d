package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// serveOptions are `serve`'s flags.
type serveOptions struct {
	listen, adminListen string
	advertise           string
	domain              string
	replica             string
	tick                time.Duration
	logJSON             bool
}

func runServe(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "serve", `Usage: nomad-serverless serve [options]

Runs the control plane: the gateway and activator on -listen, the admin API
(/healthz, /metrics, autoscaler state) on -admin-listen, and, on the replica that
holds the Consul lock, the autoscaler. Reads NOMAD_ADDR, CONSUL_HTTP_ADDR and tokens
from the environment. Run several replicas behind a load balancer for high availability.

`)
	host, _ := os.Hostname()
	var o serveOptions
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "`address` of the gateway (user traffic)")
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:8081", "`address` of the admin API (health, metrics, autoscaler state)")
	fs.StringVar(&o.advertise, "advertise", "", "`IP` other nodes reach this replica at (registered in Consul); default: the -listen host, or the Consul agent's address when that is a wildcard")
	fs.StringVar(&o.domain, "domain", activator.DefaultDomain, "services answer at <service>.<namespace>.`domain`")
	fs.StringVar(&o.replica, "replica", host, "this replica's `name` (unique among serve replicas)")
	fs.DurationVar(&o.tick, "tick", 2*time.Second, "the autoscaler's decision period")
	fs.BoolVar(&o.logJSON, "log-json", false, "log JSON lines instead of text")
	if _, err := parseFlagsAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if o.replica == "" {
		fmt.Fprintln(e.stderr, "nomad-serverless serve: -replica is empty and the host name is unknown; name this replica")
		return exitUsage
	}
	var handler slog.Handler = slog.NewTextHandler(e.stderr, nil)
	if o.logJSON {
		handler = slog.NewJSONHandler(e.stderr, nil)
	}
	log := slog.New(handler).With("replica", o.replica)
	if err := serve(ctx, o, log); err != nil {
		return errorLine(e, "serve", err)
	}
	return exitOK
}

// serve runs the control plane until ctx ends.
func serve(ctx context.Context, o serveOptions, log *slog.Logger) error {
	nomad, err := newNomad()
	if err != nil {
		return err
	}
	nomad.SetLogger(log)
	consul, err := newConsul(consulroute.WithReplica(o.replica), consulroute.WithLogger(log))
	if err != nil {
		return err
	}

	// Listen first: a port in use is the most common start-up failure and
	// should be said before anything registers anywhere.
	gwLn, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fmt.Errorf("listen for the gateway on %s: %w", o.listen, err)
	}
	defer gwLn.Close()
	adminLn, err := net.Listen("tcp", o.adminListen)
	if err != nil {
		return fmt.Errorf("listen for the admin API on %s: %w", o.adminListen, err)
	}
	defer adminLn.Close()
	gwPort := gwLn.Addr().(*net.TCPAddr).Port
	adminPort := adminLn.Addr().(*net.TCPAddr).Port
	advertise, err := advertiseAddress(o, consul)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
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
	auto, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: scaler, Tick: o.tick, Logger: log, Registerer: reg})
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
	waker, err := autoscaler.NewWaker(autoscaler.WakerConfig{Revisions: cat, Raiser: nomad, Next: sink, Local: auto, Logger: log})
	if err != nil {
		return err
	}
	gw, err := activator.New(activator.Config{Catalog: cat, Autoscaler: waker, Domain: o.domain, Replica: o.replica, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	admin, err := adminHandler(gw, auto, keys.verifier)
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

	listed := make(chan struct{})
	goRun("follow Nomad", func(ctx context.Context) error {
		return feedNomad(ctx, nomad, cat, tags, func() { close(listed) }, log)
	})
	recordsLoaded, readyJoined := make(chan struct{}), make(chan struct{})
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
		lock := consul.NewLock(consulroute.AutoscalerLockKey, o.replica, consulroute.LockTTL,
			consulroute.WithSessionCheck(spec.ActivatorServiceName, consul.ActivatorCheckID("")))
		return autoscaler.RunWhenLeader(ctx, lock, auto.Run, log)
	})
	goRun("leader lookup", func(ctx context.Context) error { leader.follow(ctx, consul, log); return nil })
	goRun("follow the admin API keyring", func(ctx context.Context) error { return keys.follow(ctx, consul) })
	// Stand-ins start once Nomad's revisions are listed (before that every
	// stand-in looks unwanted) and this replica's activator is registered
	// (their alias checks mirror it).
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

	gwSrv := gw.Server(o.listen)
	adminSrv := &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	// Both listeners screen request heads for smuggling (CL with TE,
	// duplicate CL, obs-fold) before net/http reads them.
	goRun("gateway listener", func(ctx context.Context) error {
		awaitCatalog(ctx, catalogLoadWait, log, listed, recordsLoaded, readyJoined)
		return ignoreClosed(gwSrv.Serve(gw.Listener(gwLn)))
	})
	adminScreened := keepalive.ScreenListener{Listener: adminLn, MaxHead: http.DefaultMaxHeaderBytes + 4<<10}
	goRun("admin listener", func(context.Context) error { return ignoreClosed(adminSrv.Serve(adminScreened)) })

	self := consulroute.ActivatorRegistration{Address: advertise, Port: gwPort, AdminPort: adminPort, Domain: o.domain}
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
	log.Info("serving", "gateway", gwLn.Addr().String(), "admin", adminLn.Addr().String(), "advertise", advertise, "domain", o.domain)

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
	_ = gwSrv.Shutdown(stop)
	_ = adminSrv.Shutdown(stop)
	wg.Wait()
	if p := fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// catalogLoadWait bounds how long a starting serve keeps its gateway's
// connections waiting for the catalog (awaitCatalog). A healthy cluster
// loads it in milliseconds; past this, clients get the gateway's own
// answers (and it logs why) rather than wait toward their timeouts.
const catalogLoadWait = 10 * time.Second

// awaitCatalog returns once every one of loaded is closed (Nomad's
// revisions listed, Consul's routes and ready instances joined to them),
// after wait, or when ctx ends. A starting serve takes no request before:
// the kernel holds the connections made meanwhile in the listening
// socket's backlog, and they are served once the gateway knows the
// cluster. Otherwise a restarted serve answers its first requests from a
// catalog still loading: 404 for a service that exists, 503 for a
// revision it has not learned of yet (69 and 283 of them in one run of
// e2e scenario 7, none since).
func awaitCatalog(ctx context.Context, wait time.Duration, log *slog.Logger, loaded ...<-chan struct{}) {
	t := time.NewTimer(wait)
	defer t.Stop()
	for _, ch := range loaded {
		select {
		case <-ch:
		case <-ctx.Done():
			return
		case <-t.C:
			log.Warn("the gateway takes requests before the catalog has loaded: Nomad or Consul is slow to answer; services not loaded yet are answered 404 or 503", "waited", wait)
			return
		}
	}
}

// untilReleased is ctx, except that it ends only once the leader lock is
// released as well (at most 5 s later): see serve.
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

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// advertiseAddress is the IP registered in Consul for this replica.
func advertiseAddress(o serveOptions, consul *consulroute.Client) (string, error) {
	if o.advertise != "" {
		return o.advertise, nil
	}
	host, _, err := net.SplitHostPort(o.listen)
	if err != nil {
		return "", fmt.Errorf("-listen %q: %w", o.listen, err)
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

// leaderAddress caches the leading replica's admin address for RemoteSink.
type leaderAddress struct {
	addr atomic.Pointer[string]
}

func (l *leaderAddress) get() (string, bool) {
	p := l.addr.Load()
	if p == nil || *p == "" {
		return "", false
	}
	return *p, true
}

// follow looks the leader up every second: the holder of the lock is a
// replica name, and the gateways registered in Consul give its admin port
// (consulroute's LeaderGateway).
func (l *leaderAddress) follow(ctx context.Context, consul *consulroute.Client, log *slog.Logger) {
	for {
		addr := ""
		if g, ok, err := consul.LeaderGateway(ctx, consulroute.AutoscalerLockKey); ok {
			addr = "http://" + g.AdminHostPort()
		} else if err != nil && ctx.Err() == nil {
			log.Debug("look up the autoscaler leader", "err", err)
		}
		l.addr.Store(&addr)
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
}
