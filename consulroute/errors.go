package consulroute

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"
)

var (
	// ErrNotFound: the record, entry or key does not exist.
	ErrNotFound = errors.New("not found")
	// ErrConflict: a check-and-set lost to a concurrent writer; read again
	// and retry.
	ErrConflict = errors.New("changed concurrently (check-and-set lost)")
	// ErrUnreachable: Consul did not answer at all.
	ErrUnreachable = errors.New("consul unreachable")
	// ErrPermissionDenied: Consul's ACLs refused the token.
	ErrPermissionDenied = errors.New("permission denied by consul ACLs")
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
		return e.Status == 0
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
	if e.Status == 0 {
		e.Hint = unreachableHint(err)
		return e
	}
	e.Hint = explain(e.Status, e.Message)
	return e
}

func unreachableHint(err error) string {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	if errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) {
		return "the TLS certificate was not accepted: set CONSUL_CACERT (or CONSUL_CAPATH) to the CA that signed Consul's certificate and CONSUL_TLS_SERVER_NAME if the name differs"
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return "is the Consul agent running there? set CONSUL_HTTP_ADDR to its address (for example http://127.0.0.1:8500)"
	}
	return "set CONSUL_HTTP_ADDR to the address of a running Consul agent"
}

// explain adds what a refusal by Consul means for nomad-serverless. The
// messages matched are Consul 1.16's (fixtures 038, 039, 041).
func explain(status int, msg string) string {
	switch {
	case status == 401 || status == 403:
		return "check CONSUL_HTTP_TOKEN: it must name a token whose ACL policy allows this " +
			"(nomad-serverless needs service_prefix \"\" write for config entries and registrations, " +
			"key_prefix \"nomad-serverless/\" write and session_prefix \"\" write)"
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
