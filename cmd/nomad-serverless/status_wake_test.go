package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// status prints the last wake's timeline one line per step, in the order
// the steps happened, with the time since the request and the delta from
// the step before.
func TestWriteLastWake(t *testing.T) {
	held := time.Unix(1_800_000_000, 0)
	ms := func(n float64) time.Time { return held.Add(time.Duration(n * float64(time.Millisecond))) }
	tl := spec.NewWakeTimeline("hello", "hello-00001", "r1", "0123456789abcdef", map[spec.WakeStep]time.Time{
		spec.WakeHeld: held, spec.WakeScaleWritten: ms(1.5), spec.WakeAppReady: ms(400), spec.WakeFirstByte: ms(402.5),
	})
	var b bytes.Buffer
	writeLastWake(&b, &tl, held.Add(30*time.Second))
	out := b.String()
	for _, want := range []string{
		"Last wake: hello-00001, 30s ago, request held by replica r1, answered by allocation 01234567",
		"first byte 402.5 ms after the request, 2.5 ms of it after the app was ready",
		"the activator holds the request",
		"scale-up from zero written to Nomad",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	last := strings.Fields(lines[len(lines)-1])
	if got := strings.Join(last[len(last)-5:], " "); got != "402.5 ms +2.5 ms app" {
		t.Errorf("last line %q: want since 402.5 ms, delta +2.5 ms, whose app", lines[len(lines)-1])
	}
	b.Reset()
	writeLastWake(&b, nil, held)
	if !strings.Contains(b.String(), "Last wake: none") {
		t.Errorf("no wake: %q", b.String())
	}
}
