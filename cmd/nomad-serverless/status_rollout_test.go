package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

func TestStatusShowsTheRollout(t *testing.T) {
	at := time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)
	ro := &consulroute.RolloutRoute{New: "hello-00002", Previous: "hello-00001", Phase: consulroute.RolloutRolledBack,
		Step: 1, Steps: 2, StepPct: 10, Reason: "error rate 31% > 2% over 47 requests at step 10%"}
	for i := range statusRolloutLines + 3 {
		ro.AddHistory(consulroute.RolloutEvent{At: at.Add(time.Duration(i) * time.Second), Kind: "judged", Message: fmt.Sprintf("line %d", i)})
	}
	var b bytes.Buffer
	writeRollout(&b, ro)
	out := b.String()
	for _, want := range []string{
		"Rollout:   hello-00001 -> hello-00002: rolled_back, step 1 of 2 (10% of the latest share",
		"(hello-00002 is marked failed)",
		"why: error rate 31% > 2% over 47 requests at step 10%",
		"14:00:14  line 14",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "line 2\n") {
		t.Errorf("status shows more than the last %d lines:\n%s", statusRolloutLines, out)
	}
	b.Reset()
	writeRollout(&b, nil)
	if b.Len() != 0 {
		t.Errorf("a service without a rollout printed %q", b.String())
	}
}
