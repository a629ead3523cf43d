package consulroute

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/agenttls"
)

var (
	// ErrNotFound: the record, entry or key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a check-and-set lost to a concurrent writer; read again
	// and retry.
	ErrConflict = errors.New("changed concurrently (check-and-set lost)")
	// ErrUnreachable: Consul did not answer at all (a failed TLS
	// handshake is ErrTLS).
	ErrUnreachable = errors.New("consul unreachable")
	// ErrPermissionDenied: Consul's ACLs refused the token.
	ErrPermissionDenied = errors.New("permission denied by consul ACLs")
	// ErrTLS: the TLS handshake with Consul failed, or one side spoke TLS
	// and the other did not: a setting is wrong, waiting will not help.
	ErrTLS = errors.New("TLS with consul failed")
)

// Error is a failed exchange with Consul, worded so a user can act on it:
// what we were doing, where, Consul's own words, and what to do.
type Error struct {
	// Op is what we were doing ("write service-splitter hello").
	Op string
	// Addr is the Consul address (CONSUL_HTTP_ADDR).
	Addr string
	// Status is Consul's HTTP status; 0 when Consul did not answer.
	Status int
	// Message is Consul's own words, when it answered.
	Message string
	// Hint says what it means for nomad-serverless and what to do.
	Hint string
	// Err is the underlying error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	b.WriteString(": ")
	if e.Status == 0 && agenttls.IsTLSError(e.Err) {
		// The hint says it all, as the Nomad adapter's does.
		fmt.Fprintf(&b, "cannot talk to Consul at %s over TLS: %s", e.Addr, e.Hint)
		return b.String()
	}
	if e.Status == 0 {
		fmt.Fprintf(&b, "cannot reach Consul at %s: %v", e.Addr, e.Err)
	} else {
		fmt.Fprintf(&b, "Consul at %s answered %d", e.Addr, e.Status)
		if e.Message != "" {
			fmt.Fprintf(&b, ": %q", e.Message)
		}
	}
	if e.Hint != "" {
		b.WriteString("; ")
		b.WriteString(e.Hint)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Err }

// Is lets callers test errors.Is(err, ErrUnreachable), ErrPermissionDenied
// and ErrNotFound without knowing the wording.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrUnreachable:
		// A TLS failure got an answer, a refusal: ErrTLS, as in nomadjob.
		return e.Status == 0 && !agenttls.IsTLSError(e.Err)
	case ErrTLS:
		return e.Status == 0 && agenttls.IsTLSError(e.Err) || e.Status == 400 && agenttls.IsPlainToTLS(e.Message)
	case ErrPermissionDenied:
		return e.Status == 403
	case ErrNotFound:
		return e.Status == 404
	}
	return false
}

var unexpectedCode = regexp.MustCompile(`Unexpected response code: (\d{3})(?: \((.*)\))?`)

// wrap turns an error of the Consul API client into an *Error that says what
// happened and what to do. Context cancellation is passed through wrapped
// only with op, since nothing went wrong with Consul.
func (c *Client) wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	e := &Error{Op: op, Addr: c.addr, Err: err}
	var se api.StatusError
	if errors.As(err, &se) {
		e.Status, e.Message = se.Code, se.Body
	} else if m := unexpectedCode.FindStringSubmatch(err.Error()); m != nil {
		e.Status, _ = strconv.Atoi(m[1])
		e.Message = m[2]
	}
	switch {
	case e.Status == 0:
		e.Hint = c.unreachableHint(err)
	case e.Status == 400 && agenttls.IsPlainToTLS(e.Message):
		e.Hint = agenttls.Hint(agenttls.Consul, err, true, c.caCert)
	case e.Status == 401 || e.Status == 403:
		e.Hint = c.permissionHint(e.Message)
	default:
		e.Hint = explain(e.Status, e.Message)
	}
	return e
}

func (c *Client) unreachableHint(err error) string {
	if agenttls.IsTLSError(err) {
		return agenttls.Hint(agenttls.Consul, err, false, c.caCert)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return "is the Consul agent running there? set CONSUL_HTTP_ADDR to its address (for example http://127.0.0.1:8500)"
	}
	return "set CONSUL_HTTP_ADDR to the address of a running Consul agent"
}

// lacksPermission is how Consul (1.16 on) says which permission a token
// lacks: "Permission denied: token with AccessorID '...' lacks permission
// 'service:write' on \"hello\"" (or "anonymous token lacks ...").
var lacksPermission = regexp.MustCompile(`lacks permission '([a-z_]+:[a-z]+)'(?: on ("[^"]*"|\S+))?`)

// permissionHint says which token setting to change for a 403, from what
// Consul said and whether a token was sent, and names the policy to grant.
func (c *Client) permissionHint(msg string) string {
	what := "it"
	if m := lacksPermission.FindStringSubmatch(msg); m != nil {
		what = m[1]
		if m[2] != "" {
			what += " on " + m[2]
		}
	}
	holding := "a token whose ACL policy allows " + what
	grant := "grant the token in CONSUL_HTTP_TOKEN " + what
	if c.policy != "" {
		holding = fmt.Sprintf("a token with the policy %s that `nomad-serverless install -out` writes", c.policy)
		grant = fmt.Sprintf("the token in CONSUL_HTTP_TOKEN lacks %s: grant it the policy %s that `nomad-serverless install -out` writes", what, c.policy)
	}
	switch {
	case strings.Contains(msg, "ACL not found"):
		return "Consul does not know the token in CONSUL_HTTP_TOKEN: it has expired, or was deleted, or is from another cluster: set CONSUL_HTTP_TOKEN to the secret ID of " + holding
	case !c.tokenSet || strings.Contains(msg, "anonymous token"):
		return "CONSUL_HTTP_TOKEN is not set, and Consul's anonymous token lacks " + what + ": set CONSUL_HTTP_TOKEN to the secret ID of " + holding
	}
	return grant
}

// explain adds what a refusal by Consul means for nomad-serverless. The
// messages matched are Consul 1.16's (fixtures 038, 039, 041).
func explain(status int, msg string) string {
	switch {
	case strings.Contains(msg, "sum of all split weights must be 100"):
		return "the traffic percents of a service must add up to exactly 100; fix the service's traffic blocks"
	case strings.Contains(msg, "does not permit advanced routing or splitting"):
		return "splitting and routing need protocol \"http\" on the service and every revision; " +
			"nomad-serverless writes service-defaults with protocol http before the splitter, so another tool " +
			"(or a proxy-defaults entry) changed the protocol: set it back to http"
	case strings.Contains(msg, "No cluster leader"):
		return "Consul has no leader yet; wait for the servers to elect one and retry"
	case strings.Contains(msg, "Config entry not found"), status == 404:
		return ""
	case status == 429:
		return "Consul is rate-limiting requests; retry later"
	}
	return ""
}
