package nomadjob

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// capReadLogs is the capability Nomad's allocation logs API needs.
const capReadLogs = "read-logs"

// LogRequest names one task's log of an allocation and where to start
// reading it.
type LogRequest struct {
	// Alloc is the allocation ID; Task the task (spec.UserTaskName or
	// spec.SidecarTaskName); Stderr reads stderr instead of stdout.
	Alloc  string
	Task   string
	Stderr bool
	// Since starts with what the task wrote to its log files modified at
	// or after Since, and at most MaxHistory bytes of it: Nomad's logs
	// carry no timestamps, so the history is whole rotated files (most
	// often the one file being written), cut to its last MaxHistory
	// bytes. The zero Since starts at the end: only new output.
	Since      time.Time
	MaxHistory int64
	// Follow keeps reading as the task writes, until it stops; otherwise
	// Logs returns once it has read what is there.
	Follow bool
}

func (r LogRequest) logType() string {
	if r.Stderr {
		return "stderr"
	}
	return "stdout"
}

// Logs reads a task's log through Nomad's allocation logs API (GET
// /v1/client/fs/logs/:alloc, as `nomad alloc logs` does) and passes the
// data to fn in the pieces Nomad sends, which need not end at line
// boundaries. It returns nil when the log ended (the task stopped and all
// of it was read, or everything there was read and Follow is false), ctx's
// error when ctx is done, and fn's error if fn fails. It never changes the
// allocation.
func (c *Client) Logs(ctx context.Context, revision string, req LogRequest, fn func([]byte) error) error {
	// Cancelled on return, which ends the API client's request whatever
	// made Logs return.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ns := c.namespaceOf(revision)
	op := fmt.Sprintf("read the %s log of task %s in allocation %s", req.logType(), req.Task, shortAlloc(req.Alloc))
	alloc, _, err := c.api.Allocations().Info(req.Alloc, c.query(ctx, ns))
	if err != nil {
		return c.wrap(op, ns, capRead, err)
	}
	offset, err := c.history(ctx, alloc, ns, req)
	if err != nil {
		return c.wrap(op, ns, capReadLogs, err)
	}
	frames, errs := c.api.AllocFS().Logs(alloc, req.Follow, req.Task, req.logType(), api.OriginEnd, offset, ctx.Done(), c.query(ctx, ns))
	for {
		select {
		case <-ctx.Done():
			drain(frames, errs)
			return fmt.Errorf("%s: %w", op, ctx.Err())
		case err := <-errs:
			if ctx.Err() != nil {
				return fmt.Errorf("%s: %w", op, ctx.Err())
			}
			return c.wrap(op, ns, capReadLogs, err)
		case f, ok := <-frames:
			if !ok {
				return nil
			}
			if len(f.Data) == 0 {
				continue // file events: truncation, deletion
			}
			if err := fn(f.Data); err != nil {
				drain(frames, errs)
				return err
			}
		}
	}
}

// history is how many bytes before the end of the log Logs starts: the
// size of the log files modified since req.Since, at most req.MaxHistory.
func (c *Client) history(ctx context.Context, alloc *api.Allocation, ns string, req LogRequest) (int64, error) {
	if req.Since.IsZero() || req.MaxHistory <= 0 {
		return 0, nil
	}
	files, _, err := c.api.AllocFS().List(alloc, "alloc/logs", c.query(ctx, ns))
	if err != nil {
		var ue api.UnexpectedResponseError
		if errors.As(err, &ue) && ue.HasStatusCode() && ue.StatusCode() == 404 {
			return 0, nil // the task has written nothing yet
		}
		return 0, err
	}
	// Rotated files are named <task>.<stdout|stderr>.<n>.
	prefix := req.Task + "." + req.logType() + "."
	var size int64
	for _, f := range files {
		if !f.IsDir && strings.HasPrefix(f.Name, prefix) && !f.ModTime.Before(req.Since) {
			size += f.Size
		}
	}
	return min(size, req.MaxHistory), nil
}

// drain reads what the API client's reader still sends until it stops
// (closes frames, or reports the cancelled request on errs), so its
// goroutine does not block on a send nobody reads.
func drain(frames <-chan *api.StreamFrame, errs <-chan error) {
	if frames == nil {
		return
	}
	go func() {
		for {
			select {
			case _, ok := <-frames:
				if !ok {
					return
				}
			case <-errs:
				return
			}
		}
	}()
}

func shortAlloc(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}
