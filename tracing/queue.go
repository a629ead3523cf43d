package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// queue is the span processor between the request paths and the
// exporter. A finished span is handed over with a non-blocking send to a
// channel of fixed capacity; one goroutine exports batches. When the
// collector is slow or gone the channel fills and further spans are
// dropped and counted (nomad_serverless_trace_spans_dropped_total), so a
// request path never waits for the collector and memory stays bounded by
// the channel and one batch.
//
// The SDK's BatchSpanProcessor behaves alike but counts its drops only in
// a log line; a dashboard needs the number.
type queue struct {
	exp     sdktrace.SpanExporter
	log     *slog.Logger
	ch      chan sdktrace.ReadOnlySpan
	batch   int
	every   time.Duration
	timeout time.Duration

	dropped  *prometheus.CounterVec
	exported prometheus.Counter

	// wake tells the exporting goroutine that a batch is waiting; it
	// sleeps otherwise until its tick, so a span's end wakes no goroutine
	// (one wake per batch, not one per span).
	wake chan struct{}

	stopOnce sync.Once
	stop     chan struct{}
	flushCh  chan chan struct{}
	done     chan struct{}
}

// queueConfig sizes a queue; zero fields take the defaults.
type queueConfig struct {
	Capacity int           // spans waiting (default 2048)
	Batch    int           // spans per export (default 512)
	Every    time.Duration // longest wait before a partial batch goes (default 1s)
	Timeout  time.Duration // bound of one export (default 5s)
}

// The reasons a span is dropped.
const (
	dropQueueFull    = "queue_full"
	dropExportFailed = "export_failed"
)

func newQueue(exp sdktrace.SpanExporter, cfg queueConfig, reg prometheus.Registerer, log *slog.Logger) (*queue, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Capacity <= 0 {
		cfg.Capacity = 2048
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 512
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	q := &queue{
		exp: exp, log: log,
		ch:    make(chan sdktrace.ReadOnlySpan, cfg.Capacity),
		batch: cfg.Batch, every: cfg.Every, timeout: cfg.Timeout,
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "nomad_serverless", Name: "trace_spans_dropped_total",
			Help: "Sampled spans not exported: the export queue was full (queue_full; the collector is slow or unreachable) or the export failed (export_failed).",
		}, []string{"reason"}),
		exported: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "nomad_serverless", Name: "trace_spans_exported_total",
			Help: "Spans the collector accepted.",
		}),
		wake:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		flushCh: make(chan chan struct{}),
		done:    make(chan struct{}),
	}
	// Both reasons show from the start, so a rate() sees the first drop.
	q.dropped.WithLabelValues(dropQueueFull)
	q.dropped.WithLabelValues(dropExportFailed)
	if reg != nil {
		for _, c := range []prometheus.Collector{q.dropped, q.exported} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("registering the tracing metrics: %w", err)
			}
		}
	}
	go q.run()
	return q, nil
}

func (q *queue) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd hands a sampled span to the exporting goroutine, or drops it if
// the queue is full. It never blocks.
func (q *queue) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	select {
	case q.ch <- s:
		if len(q.ch) >= q.batch {
			select {
			case q.wake <- struct{}{}:
			default: // already told
			}
		}
	default:
		q.dropped.WithLabelValues(dropQueueFull).Inc()
	}
}

func (q *queue) run() {
	defer close(q.done)
	t := time.NewTicker(q.every)
	defer t.Stop()
	buf := make([]sdktrace.ReadOnlySpan, 0, q.batch)
	for {
		select {
		case <-q.wake:
			buf = q.drain(buf)
		case <-t.C:
			buf = q.drain(buf)
		case ack := <-q.flushCh:
			buf = q.drain(buf)
			close(ack)
		case <-q.stop:
			q.drain(buf)
			return
		}
	}
}

// drain exports everything queued now.
func (q *queue) drain(buf []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	for {
		select {
		case s := <-q.ch:
			buf = append(buf, s)
			if len(buf) >= q.batch {
				buf = q.export(buf)
			}
		default:
			return q.export(buf)
		}
	}
}

// export sends one batch, bounded by the timeout, and returns the emptied
// buffer.
func (q *queue) export(buf []sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	if len(buf) == 0 {
		return buf
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.timeout)
	err := q.exp.ExportSpans(ctx, buf)
	cancel()
	if err != nil {
		q.dropped.WithLabelValues(dropExportFailed).Add(float64(len(buf)))
		q.log.Debug("exporting spans failed; they are dropped", "spans", len(buf), "err", err)
	} else {
		q.exported.Add(float64(len(buf)))
	}
	clear(buf)
	return buf[:0]
}

// ForceFlush exports what is queued, waiting at most until ctx ends.
func (q *queue) ForceFlush(ctx context.Context) error {
	ack := make(chan struct{})
	select {
	case q.flushCh <- ack:
	case <-q.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flushing spans: %w", ctx.Err())
	}
	select {
	case <-ack:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("flushing spans: %w", ctx.Err())
	}
}

// Shutdown exports what is queued and stops the exporter.
func (q *queue) Shutdown(ctx context.Context) error {
	q.stopOnce.Do(func() { close(q.stop) })
	select {
	case <-q.done:
	case <-ctx.Done():
		return fmt.Errorf("stopping the span queue: %w", ctx.Err())
	}
	if err := q.exp.Shutdown(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("stopping the span exporter: %w", err)
	}
	return nil
}
