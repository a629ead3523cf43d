package canary

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fuzzInput hands out the fuzzer's input one byte at a time, then zeros.
type fuzzInput struct{ b []byte }

func (r *fuzzInput) next() int {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return int(v)
}

func (r *fuzzInput) measurement(latency bool) Measurement {
	n := r.next()
	m := Measurement{Requests: uint64(n), Errors: uint64(r.next() % (n + 1))}
	if latency && n > 0 {
		// Up to n requests timed, at one of the histogram's buckets.
		timed := r.next() % (n + 1)
		m.Latency.Counts[r.next()%NumBuckets] = uint64(timed)
	}
	return m
}

// Any plan, any sequence of ticks (any gaps, measurements and readiness),
// failovers through JSON, people taking over and refused measurements:
// the route stays within the latest share, the new revision's weight
// never goes back except to 0 by a rollback, no more judgments are made
// than the plan allows, and once the inputs stop being odd the rollout
// ends (completed, rolled back or stopped) within that many intervals.
func FuzzMachine(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{3, 10, 20, 30, 1, 2, 5, 10, 2, 3, 0, 40, 50, 0, 1, 0, 1, 0, 16, 12, 0, 30, 0, 2, 0, 100, 0, 1, 30, 7, 1})
	f.Add([]byte{4, 1, 1, 1, 1, 0, 0, 20, 1, 0, 255, 255, 9, 0, 0, 64, 200, 0, 200, 50, 200, 0, 1, 13, 64, 100, 100, 0, 0, 1, 14})
	f.Add([]byte{0, 99, 0, 0, 0, 9, 0, 0, 0, 0, 100, 12, 0, 13, 5, 12, 64, 50, 1, 50, 40, 1, 1, 15, 12, 250, 250, 250, 250, 3, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := &fuzzInput{b: data}
		var steps []int
		for s, n := 0, 1+r.next()%6; len(steps) < n; {
			s += 1 + r.next()%40
			if s > 100 {
				break
			}
			steps = append(steps, s)
		}
		if len(steps) == 0 {
			steps = []int{100}
		}
		interval := time.Duration(1+r.next()%30) * time.Second
		p := Plan{
			Steps: steps, IntervalsPerStep: 1 + r.next()%3, Interval: interval, MinRequests: 1 + r.next()%60,
			MaxErrorRate: float64(r.next() % 101), QuietLimit: 1 + r.next()%4,
			WakeTimeout: time.Duration(1+r.next()%120) * time.Second,
		}
		if b := r.next(); b&1 != 0 {
			p.MaxLatency.Factor = 1.1 + float64(r.next()%40)/10
		} else if b&2 != 0 {
			p.MaxLatency = spec.LatencyBound{Factor: 2, Absolute: time.Duration(1+r.next()) * time.Millisecond}
		}
		c := Config{Service: "s", New: "s-00002", Previous: "s-00001", LatestPercent: 1 + r.next()%100, Plan: p}
		now := t0
		m, err := New(c, now)
		if err != nil {
			t.Fatalf("a valid config refused: %v", err)
		}
		all := Weight(c.LatestPercent) * 100
		judgments, lastWeight := 0, Weight(0)
		check := func(o Output) {
			t.Helper()
			ph := m.Phase()
			if (o.Route == nil) != (ph == PhaseStopped) {
				t.Fatalf("phase %s with route %+v", ph, o.Route)
			}
			if (o.Wake != "") != (ph == PhaseWaking) {
				t.Fatalf("phase %s asks to wake %q", ph, o.Wake)
			}
			for _, e := range o.Events {
				if e.Kind == EventJudged {
					judgments++
				}
				if e.Step < 0 || e.Step > len(steps) {
					t.Fatalf("event of step %d: %+v", e.Step, e)
				}
			}
			if judgments > p.MaxJudgments() {
				t.Fatalf("%d judgments, the plan allows %d", judgments, p.MaxJudgments())
			}
			if o.Route == nil {
				return
			}
			w := o.Route.NewWeight
			if w < 0 || w > all || w+o.Route.PreviousWeight != all {
				t.Fatalf("route %+v outside a latest share of %d", o.Route, all)
			}
			switch {
			case ph == PhaseRolledBack && w != 0:
				t.Fatalf("rolled back with %d to the new revision", w)
			case ph == PhaseCompleted && w != all:
				t.Fatalf("completed with %d of %d", w, all)
			case ph != PhaseRolledBack && w < lastWeight:
				t.Fatalf("the new revision went back from %d to %d in phase %s", lastWeight, w, ph)
			}
			lastWeight = w
		}

		for ops := 0; len(r.b) > 0 && ops < 400; ops++ {
			endedAs := m.Phase()
			switch op := r.next() % 16; {
			case op < 12:
				now = now.Add(time.Duration(r.next()) * interval / 64)
				in := Input{New: r.measurement(true), Previous: r.measurement(true), NewReady: r.next()%2 == 1}
				o, err := m.Tick(now, in)
				if err != nil {
					t.Fatalf("a possible measurement refused: %v", err)
				}
				check(o)
			case op < 14:
				// Failover: the state through JSON, a takeover later.
				b, err := json.Marshal(m.State())
				if err != nil {
					t.Fatal(err)
				}
				var st State
				if err := json.Unmarshal(b, &st); err != nil {
					t.Fatal(err)
				}
				if m, err = Load(st); err != nil {
					t.Fatalf("a stored state refused: %v", err)
				}
				now = now.Add(time.Duration(r.next()) * 100 * time.Millisecond)
				check(m.Resume(now))
			case op == 14:
				if r.next()%4 == 0 {
					check(m.Interrupt(now, "a person"))
				}
			default:
				before := m.State()
				if _, err := m.Tick(now, Input{New: Measurement{Requests: 1, Errors: 2}}); err == nil {
					t.Fatal("an impossible measurement accepted")
				}
				if !reflect.DeepEqual(before, m.State()) {
					t.Fatal("a refused measurement changed the state")
				}
			}
			if endedAs.Ended() && m.Phase() != endedAs {
				t.Fatalf("ended as %s, then became %s", endedAs, m.Phase())
			}
		}

		// Plain ticks, one interval apart: each judges once, so the
		// rollout ends within the judgments the plan has left.
		for i := 0; !m.Phase().Ended(); i++ {
			if i > p.MaxJudgments()+1 {
				t.Fatalf("still %s after %d more intervals (%d judgments)", m.Phase(), i, judgments)
			}
			now = now.Add(interval)
			o, err := m.Tick(now, Input{New: r.measurement(true), Previous: r.measurement(true), NewReady: true})
			if err != nil {
				t.Fatal(err)
			}
			check(o)
		}
	})
}
