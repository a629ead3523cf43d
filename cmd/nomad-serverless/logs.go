package main

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
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Bounds of what logs reads before following: Nomad's logs carry no
// timestamps, so -since selects whole log files by their modification time,
// and each instance's history is cut to its last logsMaxHistory bytes.
const (
	logsMaxSince   = 24 * time.Hour
	logsMaxHistory = 256 << 10
	// logsMaxLine is where a line without a newline is cut, so one
	// instance writing without newlines does not hold the output.
	logsMaxLine = 64 << 10
	logsPoll    = 2 * time.Second
)

// logSource is what logs reads from Nomad: a service's revisions, their
// allocations and a task's log. It has no way to scale or to send a
// request, so following a revision cannot wake it.
type logSource interface {
	Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error)
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Logs(ctx context.Context, revision string, req nomadjob.LogRequest, fn func([]byte) error) error
}

func runLogs(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "logs", `Usage: nomad-serverless logs [options] <service>

Follows the logs of every running instance of a service through Nomad's
allocation logs API (as nomad alloc logs -f), interleaved line by line and
prefixed with the allocation ID: the user task's stdout unless -stderr or
-sidecar say otherwise. New instances are followed as they start. A revision
at zero has no instance and so no logs; logs says so and does not wake it.
Needs the read-logs capability in the namespace (NOMAD_TOKEN).

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	revision := fs.String("revision", "", "follow only this `revision` (default: every revision with instances)")
	sidecar := fs.Bool("sidecar", false, "the queue-proxy sidecar's log instead of the user task's")
	stderr := fs.Bool("stderr", false, "stderr instead of stdout")
	since := fs.Duration("since", time.Minute, fmt.Sprintf("start with what running instances logged in the last `duration` (whole log files, at most %d KiB each; at most %s; 0: only new lines)", logsMaxHistory>>10, logsMaxSince))
	follow := fs.Bool("follow", true, "keep following; with -follow=false print what is there and exit")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	if *since < 0 || *since > logsMaxSince {
		fmt.Fprintf(e.stderr, "nomad-serverless logs: -since %s is out of range: use 0 to %s (Nomad keeps only the last few log files of an instance anyway)\n", *since, logsMaxSince)
		return exitUsage
	}
	n, err := newNomad()
	if err != nil {
		return errorLine(e, "logs", err)
	}
	task := spec.UserTaskName
	if *sidecar {
		task = spec.SidecarTaskName
	}
	l := &logsRun{
		src: n, out: e.stdout, msg: e.stderr,
		namespace: *namespace, service: service, revision: *revision,
		task: task, stderr: *stderr, since: *since, follow: *follow,
		now: time.Now, wait: sleepOrDone(logsPoll),
	}
	return l.run(ctx)
}

// logsRun is one run of the logs command.
type logsRun struct {
	src      logSource
	out, msg io.Writer // log lines; what logs itself says

	namespace, service, revision string
	task                         string
	stderr, follow               bool
	since                        time.Duration

	now func() time.Time
	// wait pauses between looks for new instances; false once ctx is done.
	wait func(ctx context.Context) bool
}

// sleepOrDone waits d or until ctx is done.
func sleepOrDone(d time.Duration) func(ctx context.Context) bool {
	return func(ctx context.Context) bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
			return true
		}
	}
}

func (l *logsRun) run(ctx context.Context) int {
	revs, err := l.revisions(ctx)
	if err != nil {
		fmt.Fprintf(l.msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
		return exitError
	}
	stream := "stdout"
	if l.stderr {
		stream = "stderr"
	}
	what := fmt.Sprintf("task %s, %s", l.task, stream)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lines := make(chan string, 64)
	printed := make(chan struct{})
	go func() {
		defer close(printed)
		for line := range lines {
			fmt.Fprintln(l.out, line)
		}
	}()
	var wg sync.WaitGroup
	finish := func(code int) int {
		cancel()
		wg.Wait()
		close(lines)
		<-printed
		return code
	}

	started := l.now()
	followed := map[string]bool{} // allocation IDs followed (or being followed)
	var mu sync.Mutex             // guards followed: followers forget an allocation whose log broke
	for first := true; ; first = false {
		running, states, err := l.running(ctx, revs)
		switch {
		case err != nil && first:
			fmt.Fprintf(l.msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
			return finish(exitError)
		case err != nil && ctx.Err() == nil:
			fmt.Fprintf(l.msg, "nomad-serverless logs: %s (trying again)\n", nomadjob.Describe(err))
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
			fmt.Fprintf(l.msg, "nomad-serverless logs: no instance of %s is running, so there are no logs to show (%s). "+
				"A revision at zero has no instance and no logs until a request wakes it; logs does not wake it.\n",
				l.service, strings.Join(states, "; "))
			if !l.follow {
				return finish(exitError)
			}
			fmt.Fprintln(l.msg, "nomad-serverless logs: waiting for an instance to start (Ctrl-C to stop)")
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
			fmt.Fprintf(l.msg, "nomad-serverless logs: %s %s (%s)\n", verb, strings.Join(ids, ", "), what)
		}
		for _, a := range fresh {
			req := nomadjob.LogRequest{Alloc: a.ID, Task: l.task, Stderr: l.stderr, Follow: l.follow, MaxHistory: logsMaxHistory}
			switch {
			case first && l.since > 0:
				req.Since = started.Add(-l.since)
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
					fmt.Fprintf(l.msg, "nomad-serverless logs: %s\n", nomadjob.Describe(err))
					// Looked at again on the next round, from its end.
					mu.Lock()
					delete(followed, a.ID)
					mu.Unlock()
				case l.follow:
					fmt.Fprintf(l.msg, "nomad-serverless logs: instance %s of %s stopped\n", shortID(a.ID), a.Revision)
				}
			}()
		}
		if !l.follow {
			wg.Wait()
			return finish(exitOK)
		}
		if !l.wait(ctx) {
			return finish(exitOK) // interrupted: the normal end of following
		}
	}
}

// revisions are the revisions to follow: the one -revision names, or every
// revision of the service that is not stopped.
func (l *logsRun) revisions(ctx context.Context) ([]nomadjob.RevisionStatus, error) {
	all, err := l.src.Revisions(ctx, l.namespace, l.service)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("service %q has no revisions in namespace %s (see `nomad-serverless list`)", l.service, l.namespace)
	}
	if l.revision != "" {
		names := make([]string, 0, len(all))
		for _, r := range all {
			if r.Name == l.revision {
				return []nomadjob.RevisionStatus{r}, nil
			}
			names = append(names, r.Name)
		}
		return nil, fmt.Errorf("%s is not a revision of service %s (its revisions: %s)", l.revision, l.service, strings.Join(names, ", "))
	}
	var out []nomadjob.RevisionStatus
	for _, r := range all {
		if !r.Stopped {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("every revision of %s is stopped: none has instances (see `nomad-serverless revisions %s`)", l.service, l.service)
	}
	return out, nil
}

// running lists the running allocations of revs, oldest first, and says
// of each revision without one what Nomad reports of it.
func (l *logsRun) running(ctx context.Context, revs []nomadjob.RevisionStatus) ([]nomadjob.Allocation, []string, error) {
	var out []nomadjob.Allocation
	var states []string
	for _, r := range revs {
		allocs, err := l.src.Allocations(ctx, r.Name)
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
func (l *logsRun) follow1(ctx context.Context, revision string, req nomadjob.LogRequest, prefix string, lines chan<- string) error {
	var partial []byte
	send := func(b []byte) error {
		select {
		case lines <- prefix + strings.TrimSuffix(string(b), "\r"):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	err := l.src.Logs(ctx, revision, req, func(data []byte) error {
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

// shortID is an allocation ID's first 8 characters, as Nomad's CLI shows it.
func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
