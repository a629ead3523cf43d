package activator

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestFailureRules(t *testing.T) {
	for _, c := range []struct {
		f                 failure
		retryable, ejects bool
	}{
		{failOther, false, false},   // may have reached the app: answered, not retried
		{failDial, true, true},      // nothing listens, or unreachable
		{failUnsent, true, false},   // a stale connection says nothing of the instance
		{failNotServed, true, true}, // the sidecar's app is down
		{failReset, true, false},    // idempotent, in flight when the instance died
	} {
		if unseen := c.f != failOther && c.f != failReset; c.f.unseen() != unseen {
			t.Errorf("%v: unseen=%v, want %v", c.f, c.f.unseen(), unseen)
		}
		if c.f.retryable() != c.retryable || c.f.ejects() != c.ejects {
			t.Errorf("%v: retryable=%v ejects=%v, want %v %v", c.f, c.f.retryable(), c.f.ejects(), c.retryable, c.ejects)
		}
	}
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		err  error
		want failure
	}{
		{refused, failDial},
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, failDial},
		{reset, failOther},
		{errors.New("something"), failOther},
	} {
		if got := classifyDial(c.err); got != c.want {
			t.Errorf("classifyDial(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

func TestRetryBudget(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	type step struct {
		deposits int           // requests before the withdrawals
		at       time.Duration // when the withdrawals happen
		tries    int
		want     int // granted
	}
	for _, c := range []struct {
		name                  string
		percent, floor, burst int
		steps                 []step
	}{
		{"a second's floor to start with", 20, 10, 100, []step{
			{0, 0, 15, 10},
		}},
		{"the floor refills with time", 20, 10, 100, []step{
			{0, 0, 10, 10},
			{0, 100 * time.Millisecond, 5, 1},
			{0, 600 * time.Millisecond, 10, 5},
		}},
		{"20 % of requests", 20, 0, 100, []step{
			{50, 0, 20, 10},
			{4, 0, 1, 0},
			{1, 0, 2, 1},
		}},
		{"saved up to the burst only", 20, 10, 30, []step{
			{10000, time.Hour, 100, 30},
			{0, time.Hour, 1, 0},
			{0, time.Hour + 100*time.Millisecond, 2, 1},
		}},
		{"an outage: a request's retry costs 5 requests' deposits", 20, 0, 100, []step{
			{100, 0, 100, 20},
			{100, time.Second, 100, 20},
		}},
		{"no budget at all", 0, 0, 1, []step{
			{1000, time.Minute, 5, 0},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := newRetryBudget(c.percent, c.floor, c.burst, t0)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range c.steps {
				for range s.deposits {
					b.deposit()
				}
				got := 0
				for range s.tries {
					if b.withdraw(at(s.at)) {
						got++
					}
				}
				if got != s.want {
					t.Fatalf("step %d: %d of %d retries granted, want %d", i, got, s.tries, s.want)
				}
			}
		})
	}
	for _, bad := range [][3]int{{-1, 0, 1}, {101, 0, 1}, {20, -1, 1}, {20, 10, 0}} {
		if _, err := newRetryBudget(bad[0], bad[1], bad[2], t0); err == nil {
			t.Errorf("newRetryBudget%v accepted", bad)
		}
	}
}
