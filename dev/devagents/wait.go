package devagents

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// WaitFor polls check every interval until it returns nil, the process
// exits, ctx ends or timeout passes. The error says which: the process's
// end with its log, or what was not ready with check's last error.
func WaitFor(ctx context.Context, p *Proc, what string, timeout, interval time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		err := check(cctx)
		ccancel()
		if err == nil {
			return nil
		}
		// A check cut short by the deadline says less than the one
		// before it.
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-p.Done():
			return errors.New(p.Describe())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not ready after %s: %v%s", what, timeout, last, p.logTail())
			}
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// agentHTTP talks to one agent's HTTP API with an optional token.
type agentHTTP struct {
	base        string // http://127.0.0.1:port
	tokenHeader string // X-Consul-Token or X-Nomad-Token
	token       string
}

// do sends a request and decodes a 200 answer's JSON into out.
func (a agentHTTP) do(ctx context.Context, method, path string, out any) error {
	return a.send(ctx, method, path, nil, out)
}

// send is do with a JSON body (none when in is nil).
func (a agentHTTP) send(ctx context.Context, method, path string, in, out any) error {
	var reqBody io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("%s %s: encode the body: %w", method, a.base+path, err)
		}
		reqBody = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, reqBody)
	if err != nil {
		return err
	}
	if a.token != "" {
		req.Header.Set(a.tokenHeader, a.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s %s", method, a.base+path, resp.Status, firstLine(string(body)))
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("%s %s: answer %q: %w", method, a.base+path, firstLine(string(body)), err)
	}
	return nil
}

// leaderIs returns a check that passes once /v1/status/leader names want
// (host:port of the server's RPC; Consul and Nomad both answer a quoted
// address, "" before an election). Any other leader means another cluster
// answers on this HTTP port: a port picked free was taken before our agent
// bound it, the agent we started is dying of "address already in use", and
// a check that took any leader would call it ready.
func (a agentHTTP) leaderIs(want string) func(context.Context) error {
	return func(ctx context.Context) error {
		var leader string
		if err := a.do(ctx, http.MethodGet, "/v1/status/leader", &leader); err != nil {
			return err
		}
		switch leader {
		case "":
			return errors.New("no leader elected yet")
		case want:
			return nil
		}
		return fmt.Errorf("%s answers with leader %s, not %s: another cluster's agent listens on this port", a.base, leader, want)
	}
}

// rawExecNodeCheck passes once Nomad has a ready client node whose raw_exec
// driver is healthy, so a deploy right after start is placed at once.
func (a agentHTTP) rawExecNodeCheck(ctx context.Context) error {
	var nodes []struct {
		Status  string
		Drivers map[string]struct{ Detected, Healthy bool }
	}
	if err := a.do(ctx, http.MethodGet, "/v1/nodes", &nodes); err != nil {
		return err
	}
	for _, n := range nodes {
		if d, ok := n.Drivers["raw_exec"]; n.Status == "ready" && ok && d.Healthy {
			return nil
		}
	}
	return fmt.Errorf("%d client nodes, none ready with a healthy raw_exec driver", len(nodes))
}

// bootstrapACL bootstraps Nomad's ACL system and returns the management
// token's secret.
func (a agentHTTP) bootstrapACL(ctx context.Context) (string, error) {
	var tok struct{ SecretID string }
	if err := a.do(ctx, http.MethodPut, "/v1/acl/bootstrap", &tok); err != nil {
		return "", err
	}
	if tok.SecretID == "" {
		return "", errors.New("the bootstrap answer has no SecretID")
	}
	return tok.SecretID, nil
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
