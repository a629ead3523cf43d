package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Bounds of what logs reads before following: Nomad's logs carry no
// timestamps, so -since selects whole log files by their modification time,
// and each instance's history is cut to its last LogsMaxHistory bytes.
const (
	LogsMaxSince   = 24 * time.Hour
	LogsMaxHistory = 256 << 10
	// logsMaxLine is where a line without a newline is cut, so one
	// instance writing without newlines does not hold the output.
	logsMaxLine = 64 << 10
	LogsPoll    = 2 * time.Second
)

// LogSource is what Logs reads from Nomad: a service's revisions, their
// allocations and a task's log. It has no way to scale or to send a
// request, so following a revision cannot wake it.
type LogSource interface {
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Logs(ctx context.Context, revision string, req nomadjob.LogRequest, fn func([]byte) error) error
}

// Logs follows the logs of a service's running instances through Nomad's
// allocation logs API (the logs command): interleaved line by line,
// prefixed with the allocation, new instances followed as they start. It
// never wakes a revision: LogSource has no way to.
type Logs struct {
	Src      LogSource
	Out, Msg io.Writer // log lines; what logs itself says

	Namespace, Service, Revision string // Revision: only this one
	Task                         string // spec.UserTaskName or spec.SidecarTaskName
	Stderr, Follow               bool
	Since                        time.Duration

	Now func() time.Time
	// Wait pauses between looks for new instances; false once ctx is done.
	Wait func(ctx context.Context) bool
}

// SleepOrDone waits d or until ctx is done.
func SleepOrDone(d time.Duration) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
}

// Run follows until ctx ends, or with Follow false until the logs do. It
// says on Msg why it failed and returns ErrFailed.
func (l *Logs) Run(ctx context.Context) error {
	revs, err := l.revisions(ctx)
	if err != nil {
		fmt.Fprintf(l.Msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
		return ErrFailed
	}
	stream := "stdout"
	if l.Stderr {
		stream = "stderr"
	}
	what := fmt.Sprintf("task %s, %s", l.Task, stream)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan string, 64)
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		for line := range lines {
			fmt.Fprintln(l.Out, line)
		}
	}()
	var wg sync.WaitGroup
	finish := func(err error) error {
		cancel()
		wg.Wait()
		close(lines)
		<-printed
		return err
	}

	started := l.Now()
	followed := map[string]bool{} // allocation IDs followed (or being followed)
	var mu sync.Mutex             // guards followed: followers forget an allocation whose log broke
	for first := true; ; first = false {
		running, states, err := l.running(ctx, revs)
		switch {
		case err != nil && first:
			fmt.Fprintf(l.Msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
			return finish(ErrFailed)
		case err != nil && ctx.Err() == nil:
			fmt.Fprintf(l.Msg, "nomad-serverless logs: %s (trying again)\n", nomadjob.Describe(err))
		}
		var fresh []nomadjob.Allocation
		mu.Lock()
		for _, a := range running {
			if !followed[a.ID] {
				followed[a.ID] = true
				fresh = append(fresh, a)
			}
		}
		mu.Unlock()
		if first && len(running) == 0 {
			fmt.Fprintf(l.Msg, "nomad-serverless logs: no instance of %s is running, so there are no logs to show (%s). "+
				"A revision at zero has no instance and no logs until a request wakes it; logs does not wake it.\n",
				l.Service, strings.Join(states, "; "))
			if !l.Follow {
				return finish(ErrFailed)
			}
			fmt.Fprintln(l.Msg, "nomad-serverless logs: waiting for an instance to start (Ctrl-C to stop)")
		}
		if len(fresh) > 0 {
			ids := make([]string, len(fresh))
			for i, a := range fresh {
				ids[i] = a.Revision + " " + shortID(a.ID)
			}
			verb := "following"
			if !first {
				verb = "new instance:"
			}
			fmt.Fprintf(l.Msg, "nomad-serverless logs: %s %s (%s)\n", verb, strings.Join(ids, ", "), what)
		}
		for _, a := range fresh {
			req := nomadjob.LogRequest{Alloc: a.ID, Task: l.Task, Stderr: l.Stderr, Follow: l.Follow, MaxHistory: LogsMaxHistory}
			switch {
			case first && l.Since > 0:
				req.Since = started.Add(-l.Since)
			case !first:
				// Started while we follow: all it wrote (within the bound).
				req.Since = a.Created
			}
			prefix := "[" + shortID(a.ID) + "] "
			if len(revs) > 1 {
				prefix = "[" + a.Revision + " " + shortID(a.ID) + "] "
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := l.follow1(ctx, a.Revision, req, prefix, lines)
				switch {
				case ctx.Err() != nil:
				case err != nil:
					fmt.Fprintf(l.Msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
					// Looked at again on the next round, from its end.
					mu.Lock()
					delete(followed, a.ID)
					mu.Unlock()
				case l.Follow:
					fmt.Fprintf(l.Msg, "nomad-serverless logs: instance %s of %s stopped\n", shortID(a.ID), a.Revision)
				}
			}()
		}
		if !l.Follow {
			wg.Wait()
			return finish(nil)
		}
		if !l.Wait(ctx) {
			return finish(nil) // interrupted: the normal end of following
		}
	}
}

// revisions are the revisions to follow: the one -revision names, or every
// revision of the service that is not stopped.
func (l *Logs) revisions(ctx context.Context) ([]nomadjob.RevisionStatus, error) {
	all, err := l.Src.Revisions(ctx, l.Namespace, l.Service)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("service %q has no revisions in namespace %s (see `nomad-serverless list`)", l.Service, l.Namespace)
	}
	if l.Revision != "" {
		names := make([]string, 0, len(all))
		for _, r := range all {
			if r.Name == l.Revision {
				return []nomadjob.RevisionStatus{r}, nil
			}
			names = append(names, r.Name)
		}
		return nil, fmt.Errorf("%s is not a revision of service %s (its revisions: %s)", l.Revision, l.Service, strings.Join(names, ", "))
	}
	var out []nomadjob.RevisionStatus
	for _, r := range all {
		if !r.Stopped {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("every revision of %s is stopped: none has instances (see `nomad-serverless revisions %s`)", l.Service, l.Service)
	}
	return out, nil
}

// running lists the running allocations of revs, oldest first, and says
// of each revision without one what Nomad reports of it.
func (l *Logs) running(ctx context.Context, revs []nomadjob.RevisionStatus) ([]nomadjob.Allocation, []string, error) {
	var out []nomadjob.Allocation
	var states []string
	for _, r := range revs {
		allocs, err := l.Src.Allocations(ctx, r.Name)
		if err != nil {
			return nil, nil, err
		}
		n, pending := 0, 0
		for _, a := range allocs {
			switch {
			case a.Running:
				out = append(out, a)
				n++
			case a.ClientStatus == "pending" && a.DesiredStatus == "run":
				pending++
			}
		}
		switch {
		case n > 0:
		case pending > 0:
			states = append(states, fmt.Sprintf("%s: %d instance(s) starting", r.Name, pending))
		case r.Desired == 0:
			states = append(states, r.Name+" is at zero")
		default:
			states = append(states, fmt.Sprintf("%s: Nomad was asked for %d instance(s) and runs none yet", r.Name, r.Desired))
		}
	}
	slices.SortStableFunc(out, func(a, b nomadjob.Allocation) int { return a.Created.Compare(b.Created) })
	return out, states, nil
}

// follow1 reads one allocation's log and sends it line by line, prefixed.
func (l *Logs) follow1(ctx context.Context, revision string, req nomadjob.LogRequest, prefix string, lines chan<- string) error {
	var partial []byte
	send := func(b []byte) error {
		select {
		case lines <- prefix + strings.TrimSuffix(string(b), "\r"):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := l.Src.Logs(ctx, revision, req, func(data []byte) error {
		partial = append(partial, data...)
		for {
			i := bytes.IndexByte(partial, '\n')
			if i < 0 {
				break
			}
			if err := send(partial[:i]); err != nil {
				return err
			}
			partial = partial[i+1:]
		}
		if len(partial) >= logsMaxLine {
			if err := send(partial); err != nil {
				return err
			}
			partial = nil
		}
		// Keep the unfinished line in a buffer of its own: data's array
		// belongs to the caller.
		partial = append([]byte(nil), partial...)
		return nil
	})
	if len(partial) > 0 && ctx.Err() == nil {
		_ = send(partial)
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return nil
	}
	return err
}
