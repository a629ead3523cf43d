package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

// status writes rollout.ExplainNotReady's explanations under its table,
// one line a revision and one a failing check; nothing when all is ready.
func TestWriteNotReady(t *testing.T) {
	nrs := []rollout.NotReady{
		{Revision: "hello-00005", Desired: 1, Reason: "allocation aaaaaaaa: task user: Exit 1: crashed on start"},
		{Revision: "hello-00004", Desired: 2, Ready: 1, Reason: "allocations 2 running; allocation cccccccc: task user: restarting (2 restarts)",
			Checks: []string{"check on _nomad-task-cccccccc: readiness: GET /healthz: 503 warming up"}},
	}
	var b bytes.Buffer
	writeNotReady(&b, nrs)
	for _, line := range []string{
		"Not ready:",
		"  hello-00005: 0 of 1 ready; allocation aaaaaaaa: task user: Exit 1: crashed on start",
		"  hello-00004: 1 of 2 ready; allocations 2 running; allocation cccccccc",
		"    check on _nomad-task-cccccccc: readiness: GET /healthz: 503 warming up",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, b.String())
		}
	}
	b.Reset()
	writeNotReady(&b, nil)
	if b.Len() != 0 {
		t.Errorf("nothing to explain wrote %q", b.String())
	}
}
