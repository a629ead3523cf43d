package rollout

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

const rolloutBlock = `rollout {
    steps = [10, 50]
    analysis {
      interval = "1s"
    }
  }`

// fakeLeader plays the control plane's leader on the fake cluster's
// record: it waits for a pending rollout, then writes its steps and ends
// it as end says, with the reason. It returns what it did.
func fakeLeader(t *testing.T, f *fakeCluster, end, reason string) <-chan string {
	done := make(chan string, 1)
	go func() {
		deadline := time.Now().Add(10 * time.Second)
		for time.Now().Before(deadline) {
			rec, idx, err := f.ReadRecord(context.Background(), "", "hello")
			if err == nil && rec.Rollout.InProgress() && rec.Rollout.Phase == consulroute.RolloutPending {
				c := *rec.Rollout
				c.Phase, c.Step, c.Steps, c.StepPct, c.NewPercent = consulroute.RolloutStepping, 1, 2, 10, 10
				c.AddHistory(consulroute.RolloutEvent{Kind: "step_started", Message: "step 1 of 2: " + c.New + " gets 10% of the latest share"},
					consulroute.RolloutEvent{Kind: "judged", Message: "10%: " + c.New + " 20 req 0% errors p99 1ms | " + c.Previous + " 180 req 0% errors p99 1ms | pass: ..."})
				rec.Rollout = &c
				if err := f.Publish(context.Background(), rec, idx); err != nil {
					done <- "publish: " + err.Error()
					return
				}
				rec, idx, _ = f.ReadRecord(context.Background(), "", "hello")
				c = *rec.Rollout
				c.Phase, c.Reason = end, reason
				c.AddHistory(consulroute.RolloutEvent{Kind: end, Message: end + ": " + reason})
				if end == consulroute.RolloutRolledBack {
					rec.Latest = c.Previous
					c.NewPercent = 0
				}
				rec.Rollout = &c
				if err := f.Publish(context.Background(), rec, idx); err != nil {
					done <- "publish: " + err.Error()
					return
				}
				done <- end
				return
			}
			time.Sleep(time.Millisecond)
		}
		done <- "no pending rollout appeared"
	}()
	return done
}

func TestDeployWithARolloutFollowsItToCompletion(t *testing.T) {
	f := newFakeCluster()
	runTestDeploy(t, f, parseDeployFile(t, "1", rolloutBlock))
	if ro := f.record["hello"].Rollout; ro != nil {
		t.Fatalf("the first revision has nothing to roll out from, yet the record has %+v", ro)
	}
	f.polls = 0
	leader := fakeLeader(t, f, consulroute.RolloutCompleted, "hello-00002 holds the latest share")
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "2", rolloutBlock))
	if got := <-leader; got != consulroute.RolloutCompleted {
		t.Fatalf("leader: %s", got)
	}
	if code != exitOK {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errs)
	}
	for _, want := range []string{
		"hello-00002 published at 0 %; its rollout from hello-00001 starts",
		"hello: rollout: step 1 of 2",
		"hello: rollout: 10%: hello-00002 20 req 0% errors p99 1ms | hello-00001 180 req",
		"rollout of hello-00002 completed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("deploy's output lacks %q:\n%s", want, out)
		}
	}
}

func TestDeployWithARolloutExitsNonZeroOnRollbackAndWarnsNextTime(t *testing.T) {
	f := newFakeCluster()
	runTestDeploy(t, f, parseDeployFile(t, "1", rolloutBlock))
	f.polls = 0
	const why = "error rate 31% > 1% over 47 requests at step 10%"
	leader := fakeLeader(t, f, consulroute.RolloutRolledBack, why)
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "2", rolloutBlock))
	<-leader
	if code != exitError || !strings.Contains(errs, "rollout of hello-00002 rolled back to hello-00001: "+why) {
		t.Fatalf("exit %d, want 1 with the reason\n%s%s", code, out, errs)
	}
	rec := f.record["hello"]
	if rec.Latest != "hello-00001" {
		t.Errorf("latest = %s after the rollback, want hello-00001", rec.Latest)
	}
	// The same spec again: deploy says it failed before, then tries again.
	f.polls = 0
	leader = fakeLeader(t, f, consulroute.RolloutCompleted, "done")
	code, out, errs = runTestDeploy(t, f, parseDeployFile(t, "2", rolloutBlock))
	<-leader
	if code != exitOK || !strings.Contains(out, "revision hello-00002 of this spec was rolled back at") || !strings.Contains(out, why+"; rolling it out again") {
		t.Errorf("exit %d; a second deploy of the failed spec did not say so first:\n%s%s", code, out, errs)
	}
}

func TestDeployDetachReturnsWithTheRolloutPending(t *testing.T) {
	f := newFakeCluster()
	runTestDeploy(t, f, parseDeployFile(t, "1", rolloutBlock))
	var out, errb bytes.Buffer
	d := newTestDeployer(t, f, &out, &errb)
	d.detach = true
	if err := d.Deploy(context.Background(), parseDeployFile(t, "2", rolloutBlock)); err != nil {
		t.Fatalf("%v\n%s%s", err, out.String(), errb.String())
	}
	ro := f.record["hello"].Rollout
	if ro == nil || ro.Phase != consulroute.RolloutPending || ro.New != "hello-00002" || ro.Previous != "hello-00001" {
		t.Fatalf("after deploy -detach the record's rollout is %+v", ro)
	}
	route, _ := f.record["hello"].Route()
	if len(route.Splits) != 1 || route.Splits[0].Revision != "hello-00001" {
		t.Errorf("a pending rollout routes %v, want everything on hello-00001", route.Splits)
	}
}

// A person wins over a rollout in progress: traffic stops it, rollback
// ends it and sends the whole share back.
func TestTrafficAndRollbackStopARollout(t *testing.T) {
	start := func(t *testing.T) *fakeCluster {
		f := newFakeCluster()
		runTestDeploy(t, f, parseDeployFile(t, "1", rolloutBlock))
		d := newTestDeployer(t, f, &bytes.Buffer{}, &bytes.Buffer{})
		d.detach = true
		if err := d.Deploy(context.Background(), parseDeployFile(t, "2", rolloutBlock)); err != nil {
			t.Fatal(err)
		}
		return f
	}
	t.Run("traffic", func(t *testing.T) {
		f := start(t)
		rec, err := SetTraffic(context.Background(), f, f, "", "hello", TrafficChange{To: []spec.TrafficTarget{{Latest: true, Percent: 100}}})
		if err != nil {
			t.Fatal(err)
		}
		if ro := rec.Rollout; ro.Phase != consulroute.RolloutStopped || ro.Reason != "traffic was set by a person" {
			t.Errorf("after traffic the rollout is %+v", ro)
		}
	})
	t.Run("rollback", func(t *testing.T) {
		f := start(t)
		rec, err := Rollback(context.Background(), f, f, "", "hello", "", time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if rec.Latest != "hello-00001" || rec.Rollout.Phase != consulroute.RolloutRolledBack || rec.Rollout.Reason != "rolled back by a person to hello-00001" {
			t.Errorf("after rollback: latest %s, rollout %+v", rec.Latest, rec.Rollout)
		}
		if _, err := Rollback(context.Background(), f, f, "", "hello", "", time.Now()); err == nil || !strings.Contains(err.Error(), "already sends its latest share to hello-00001") {
			t.Errorf("a second rollback: %v", err)
		}
		if _, err := Rollback(context.Background(), f, f, "", "hello", "hello-00009", time.Now()); err == nil {
			t.Error("rollback to a revision that does not run was taken")
		}
	})
}
