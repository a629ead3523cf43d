package nomadjob

import (
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// jobRead is the recorded read of hello-00001 (JobModifyIndex 10), its
// count and stop flag set as a case needs.
func jobRead(t *testing.T, count int, stop bool) fixtures.Exchange {
	t.Helper()
	job := roundTrip(t, helloRevision(t))
	job.TaskGroups[0].Count = new(count)
	job.JobModifyIndex = new(uint64(10))
	job.Stop = new(stop)
	return withJobBody(t, load(t, "003-job-read.json"), job)
}

// answer is an exchange for method path with Nomad's plain-text answer.
func answer(method, path string, status int, text string) fixtures.Exchange {
	return fixtures.Exchange{
		Name:     "synthetic: " + method + " " + path + " " + text,
		Request:  fixtures.Request{Method: method, Path: path, Body: []byte("null")},
		Response: fixtures.Response{Status: status, Headers: map[string]string{"Content-Type": "text/plain; charset=utf-8"}, Body: fixtures.TextBody(text)},
	}
}

func TestScaleAtLeast(t *testing.T) {
	ctx := testCtx(t)
	register := load(t, "002-job-register.json")
	event := asPut(load(t, "010-job-scale-up.json"))
	meta := map[string]string{"rule": "wake", "replica": "r2"}

	t.Run("below n: registers count n, enforcing the index read, and explains it", func(t *testing.T) {
		c, r := newTestClient(t, jobRead(t, 0, false), register, event)
		raised, err := c.ScaleAtLeast(ctx, "hello-00001", 1, "wake: 1 request waiting at r2", meta)
		if err != nil || !raised {
			t.Fatalf("ScaleAtLeast = %v, %v; want raised", raised, err)
		}
		got := r.Received()
		if len(got) != 3 {
			t.Fatalf("requests = %d, want read, register, scaling event", len(got))
		}
		var reg struct {
			Job            api.Job
			EnforceIndex   bool
			JobModifyIndex uint64
			PreserveCounts bool
		}
		got[1].JSON(t, &reg)
		if !reg.EnforceIndex || reg.JobModifyIndex != 10 || reg.PreserveCounts || *reg.Job.TaskGroups[0].Count != 1 {
			t.Errorf("register: EnforceIndex %v JobModifyIndex %d PreserveCounts %v count %d; want true 10 false 1",
				reg.EnforceIndex, reg.JobModifyIndex, reg.PreserveCounts, *reg.Job.TaskGroups[0].Count)
		}
		var ev struct {
			Count   *int
			Message string
			Meta    map[string]string
		}
		got[2].JSON(t, &ev)
		if ev.Count != nil || !strings.Contains(ev.Message, "wake: 1 request waiting at r2") || !strings.Contains(ev.Message, "from 0 to 1") || ev.Meta["replica"] != "r2" {
			t.Errorf("scaling event = %+v: want a message-only event with the reason and the meta", ev)
		}
	})

	t.Run("at least n already: nothing is written", func(t *testing.T) {
		c, r := newTestClient(t, jobRead(t, 3, false))
		raised, err := c.ScaleAtLeast(ctx, "hello-00001", 2, "wake", nil)
		if err != nil || raised {
			t.Fatalf("ScaleAtLeast = %v, %v; want nothing to do", raised, err)
		}
		if n := len(r.Received()); n != 1 {
			t.Errorf("requests = %d, want only the read", n)
		}
	})

	t.Run("a conflict is read again, and a count raised meanwhile is kept", func(t *testing.T) {
		// The leader scaled it to 3 between our read and our register.
		c, r := newTestClient(t, jobRead(t, 0, false), load(t, "004-job-register-stale-index.json"), jobRead(t, 3, false))
		raised, err := c.ScaleAtLeast(ctx, "hello-00001", 1, "wake", nil)
		if err != nil || raised {
			t.Fatalf("ScaleAtLeast = %v, %v; want no change after the conflict", raised, err)
		}
		if n := len(r.Received()); n != 3 {
			t.Errorf("requests = %d, want read, register (conflict), read", n)
		}
		r.AssertAllUsed(t)
	})

	t.Run("never above the scaling max", func(t *testing.T) {
		c, r := newTestClient(t, jobRead(t, 0, false), register, event)
		if _, err := c.ScaleAtLeast(ctx, "hello-00001", 50, "wake", nil); err != nil {
			t.Fatal(err)
		}
		var reg struct{ Job api.Job }
		r.Received()[1].JSON(t, &reg)
		if n := *reg.Job.TaskGroups[0].Count; n != 10 {
			t.Errorf("registered count %d, want the scaling max 10", n)
		}
	})

	t.Run("a stopped revision is not brought back", func(t *testing.T) {
		c, r := newTestClient(t, jobRead(t, 0, true))
		if raised, err := c.ScaleAtLeast(ctx, "hello-00001", 1, "wake", nil); err == nil || raised || !strings.Contains(err.Error(), "stopped") {
			t.Errorf("ScaleAtLeast = %v, %v; want refused: the job is stopped", raised, err)
		}
		if n := len(r.Received()); n != 1 {
			t.Errorf("requests = %d, want only the read", n)
		}
	})

	t.Run("without submit-job: the scale endpoint, with the index read as its guard", func(t *testing.T) {
		denied := answer(http.MethodPut, "/v1/jobs", http.StatusForbidden, "Permission denied")
		c, r := newTestClient(t, jobRead(t, 0, false), denied, event)
		raised, err := c.ScaleAtLeast(ctx, "hello-00001", 1, "wake: 1 request waiting at r2", meta)
		if err != nil || !raised {
			t.Fatalf("ScaleAtLeast = %v, %v; want raised through the scale endpoint", raised, err)
		}
		var sc struct {
			Count          *int
			JobModifyIndex uint64
			Message        string
			Meta           map[string]string
		}
		r.Received()[2].JSON(t, &sc)
		if sc.Count == nil || *sc.Count != 1 || sc.JobModifyIndex != 10 || !strings.Contains(sc.Message, "from 0 to 1") || sc.Meta["rule"] != "wake" {
			t.Errorf("scale request = %+v, want count 1 guarded by JobModifyIndex 10", sc)
		}
	})

	t.Run("without submit-job: a conflict on the scale endpoint (Nomad 1.8.2+) is read again", func(t *testing.T) {
		denied := answer(http.MethodPut, "/v1/jobs", http.StatusForbidden, "Permission denied")
		conflict := answer(http.MethodPut, "/v1/job/hello-00001/scale", http.StatusInternalServerError,
			"Enforcing job modify index 10: job exists with conflicting job modify index: 12")
		c, r := newTestClient(t, jobRead(t, 0, false), denied, conflict, jobRead(t, 2, false))
		raised, err := c.ScaleAtLeast(ctx, "hello-00001", 1, "wake", nil)
		if err != nil || raised {
			t.Fatalf("ScaleAtLeast = %v, %v; want no change after the conflict", raised, err)
		}
		r.AssertAllUsed(t)
	})

	t.Run("errors name what was done", func(t *testing.T) {
		c, _ := newTestClient(t, load(t, "016-job-read-unknown.json"))
		_, err := c.ScaleAtLeast(ctx, "nope-00001", 1, "wake", nil)
		if !errors.Is(err, ErrNotFound) || !strings.HasPrefix(err.Error(), "raise revision nope-00001 to at least 1: ") {
			t.Errorf("err = %v", err)
		}
		if _, err := c.ScaleAtLeast(ctx, "hello-00001", 0, "wake", nil); err == nil {
			t.Error("a raise to 0 was accepted")
		}
	})
}
