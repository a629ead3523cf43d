package nomadjob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/agenttls"
)

// Kinds of failure, for errors.Is. Every error the Client returns for a
// request Nomad answered or could not be sent is an *Error whose Kind is one
// of these.
var (
	// ErrConflict: the job changed since it was read (register with a
	// stale JobModifyIndex). Re-read the job and retry.
	ErrConflict = errors.New("job modify index conflict")
	// ErrNotFound: no such job (or allocation) in the namespace.
	ErrNotFound = errors.New("not found")
	// ErrOutOfBounds: a scale call outside the scaling block's min..max.
	ErrOutOfBounds = errors.New("count outside the scaling bounds")
	// ErrRefused: Nomad refused the request as invalid (HTTP 400).
	ErrRefused = errors.New("refused by Nomad")
	// ErrPermission: the ACL token may not do this (HTTP 403).
	ErrPermission = errors.New("permission denied")
	// ErrUnreachable: the request did not get an answer (connection
	// refused or reset, DNS, timeout, TLS). Transient.
	ErrUnreachable = errors.New("Nomad unreachable")
	// ErrServer: Nomad answered 5xx or 429. Transient.
	ErrServer = errors.New("Nomad server error")
	// ErrTLS: the TLS handshake failed, or one side spoke TLS and the
	// other did not. Not transient: a setting is wrong, and retrying
	// would only hide which.
	ErrTLS = errors.New("TLS with Nomad failed")
)

// Error is a failed Nomad request, already worded for a user: what was
// being done, what Nomad said, and what to do about it.
type Error struct {
	// Op is what was being done, naming the revision ("scale revision
	// hello-00001 to 11").
	Op string
	// Addr is the Nomad address the client talks to; Namespace the
	// namespace of the request.
	Addr      string
	Namespace string
	// Capability is the ACL capability the operation needs, named in the
	// message of a permission error.
	Capability string
	// Status is the HTTP status (0 when there was no answer) and Message
	// what Nomad wrote back.
	Status  int
	Message string
	// Kind is one of the Err* values above; Err the underlying error.
	Kind error
	Err  error
	// Credentials are what the client showed Nomad, for the hint.
	Credentials Credentials
}

// Credentials are what a client shows Nomad, named in errors so a user
// knows which setting to change.
type Credentials struct {
	// TokenSet: the client sends an ACL token (NOMAD_TOKEN).
	TokenSet bool
	// CACert is the CA file the client checks Nomad's certificate with
	// (NOMAD_CACERT); "" for the system's roots.
	CACert string
	// Policy is the ACL policy (as install renders it) the user of this
	// client should hold: nomad-serverless-deploy for the CLI,
	// nomad-serverless-control-plane for serve.
	Policy string
	// TokenRejected is what Nomad said, after a 403, when asked for the
	// token itself (/v1/acl/token/self), which any token it accepts may
	// read; "" when it answered. Nomad 2.0 answers every other endpoint
	// "Permission denied" for an expired, deleted or foreign token, as for
	// one that lacks a capability; this one says "ACL token expired" (a
	// 500) or "ACL token not found" (a 403).
	TokenRejected string
}

func (e *Error) Error() string {
	switch e.Kind {
	case ErrUnreachable:
		cause, hint := netCause(e.Err)
		return fmt.Sprintf("%s: cannot reach Nomad at %s: %s; %s", e.Op, e.Addr, cause, hint)
	case ErrTLS:
		return fmt.Sprintf("%s: cannot talk to Nomad at %s over TLS: %s", e.Op, e.Addr, tlsHint(e.Err, e.Status, e.Credentials.CACert))
	case ErrPermission:
		return fmt.Sprintf("%s: Nomad denied permission (%s): %s", e.Op, orStatus(e.Message, e.Status), e.permissionHint())
	case ErrNotFound:
		return fmt.Sprintf("%s: not found in namespace %q (Nomad: %s)", e.Op, e.Namespace, orStatus(e.Message, e.Status))
	case ErrConflict:
		return fmt.Sprintf("%s: the job was changed by someone else since it was read (Nomad: %s); read it again and retry", e.Op, orStatus(e.Message, e.Status))
	case ErrOutOfBounds:
		return fmt.Sprintf("%s: Nomad refused it: %s", e.Op, orStatus(e.Message, e.Status))
	case ErrRefused:
		return fmt.Sprintf("%s: Nomad refused the request: %s", e.Op, orStatus(e.Message, e.Status))
	case ErrServer:
		return fmt.Sprintf("%s: Nomad at %s answered %d: %s", e.Op, e.Addr, e.Status, orStatus(e.Message, e.Status))
	}
	return fmt.Sprintf("%s: %v", e.Op, e.Err)
}

// permissionHint says which token setting to change for a 403, from what
// Nomad said: no token, a token Nomad does not know, an expired one, or one
// whose policy lacks the capability.
func (e *Error) permissionHint() string {
	policy := e.Credentials.Policy
	grant := ""
	if e.Capability != "" {
		grant = fmt.Sprintf("%q on namespace %q", e.Capability, e.Namespace)
	}
	holding := "a token whose ACL policy grants " + cmp.Or(grant, "it")
	if policy != "" {
		holding += fmt.Sprintf(" (the policy %s that `nomad-serverless install -out` writes)", policy)
	}
	rejected := strings.ToLower(e.Credentials.TokenRejected)
	switch lower := strings.ToLower(e.Message); {
	case strings.Contains(lower, "token expired"), strings.Contains(rejected, "token expired"):
		return "the token in NOMAD_TOKEN has expired: create a new one (nomad acl token create) and set NOMAD_TOKEN to its secret ID"
	case strings.Contains(lower, "token not found"), strings.Contains(lower, "token is invalid"):
		return "Nomad does not know the token in NOMAD_TOKEN (deleted, mistyped, or from another cluster): set NOMAD_TOKEN to the secret ID of " + holding
	case rejected != "":
		return "Nomad does not accept the token in NOMAD_TOKEN at all: it has expired, or was deleted, or is from another cluster: set NOMAD_TOKEN to the secret ID of " + holding
	case !e.Credentials.TokenSet:
		return "NOMAD_TOKEN is not set, and Nomad's anonymous policy does not allow it: set NOMAD_TOKEN to the secret ID of " + holding
	}
	if grant == "" {
		return "check NOMAD_TOKEN: its ACL policy does not allow it"
	}
	msg := "the ACL policy of the token in NOMAD_TOKEN needs " + grant
	if policy != "" {
		msg += fmt.Sprintf(": grant it the policy %s that `nomad-serverless install -out` writes", policy)
	}
	return msg
}

// Transient reports whether the request is worth retrying as is, after a
// pause (see IsTransient); callers that do not import this package can test
// for it with errors.As and interface{ Transient() bool }.
func (e *Error) Transient() bool { return e.Kind == ErrUnreachable || e.Kind == ErrServer }

// Unwrap lets errors.Is see both the kind and the underlying error.
func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

func orStatus(msg string, status int) string {
	if msg = strings.TrimSpace(msg); msg != "" {
		return msg
	}
	if status != 0 {
		return fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	}
	return "no message"
}

// IsTransient reports whether err is worth retrying as is, after a pause:
// Nomad could not be reached or answered with a server error. A conflict is
// not transient (re-read first), nor is a refusal or a permission error.
func IsTransient(err error) bool {
	var e *Error
	return errors.As(err, &e) && e.Transient()
}

// Describe returns the message to show a user for err. Errors from the
// Client are already worded for users; anything else is returned as is.
func Describe(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.Canceled) {
		return "interrupted: " + err.Error()
	}
	return err.Error()
}

// wrap turns an error from the api client into an *Error (or a context
// error wrapped with op).
func wrap(op, addr, namespace, capability string, creds Credentials, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", op, err)
	}
	e := &Error{Op: op, Addr: addr, Namespace: namespace, Capability: capability, Credentials: creds, Err: err}
	var ue api.UnexpectedResponseError
	switch {
	case errors.As(err, &ue) && ue.HasStatusCode():
		e.Status, e.Message = ue.StatusCode(), ue.Body()
		e.Kind = kindOf(e.Status, e.Message)
		if e.Status == http.StatusBadRequest && agenttls.IsPlainToTLS(e.Message) {
			e.Kind = ErrTLS
		}
	case agenttls.IsTLSError(err):
		e.Kind = ErrTLS
	case isNetworkError(err):
		e.Kind = ErrUnreachable
	default:
		return fmt.Errorf("%s: %w", op, err)
	}
	return e
}

func kindOf(status int, msg string) error {
	lower := strings.ToLower(msg)
	switch {
	case status == http.StatusForbidden || status == http.StatusUnauthorized || strings.Contains(msg, api.PermissionDeniedErrorContent):
		return ErrPermission
	case status == http.StatusNotFound:
		return ErrNotFound
	case status == http.StatusConflict || strings.Contains(lower, "enforcing job modify index"):
		// "... job exists with conflicting job modify index: 10", or
		// "Enforcing job modify index 0: job already exists".
		return ErrConflict
	case strings.Contains(lower, "scaling policy maximum") || strings.Contains(lower, "scaling policy minimum"):
		return ErrOutOfBounds
	case status == http.StatusTooManyRequests || status >= 500:
		return ErrServer
	}
	return ErrRefused
}

func isNetworkError(err error) bool {
	var ue *url.Error
	var ne net.Error
	var oe *net.OpError
	return errors.As(err, &ue) || errors.As(err, &ne) || errors.As(err, &oe) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNREFUSED)
}

// netCause says in a few words why a request got no answer, and what to
// check.
func netCause(err error) (cause, hint string) {
	hint = "is the agent running? set NOMAD_ADDR"
	var dns *net.DNSError
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		cause = "connection refused"
	case errors.Is(err, syscall.ECONNRESET):
		cause = "connection reset"
	case errors.As(err, &dns):
		cause = fmt.Sprintf("cannot resolve %q", dns.Name)
		hint = "check the host name in NOMAD_ADDR"
	case errors.As(err, &ne) && ne.Timeout():
		cause = "timed out"
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		cause = "the connection closed before an answer"
	case errors.As(err, &ue):
		cause = ue.Err.Error()
	default:
		cause = err.Error()
	}
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Net == "unix" && oe.Addr != nil {
		// NOMAD_ADDR=unix://${NOMAD_SECRETS_DIR}/api.sock: the task API.
		// Nomad only soft-fails when it cannot make the socket.
		if errors.Is(err, syscall.ENOENT) {
			cause = "no socket at " + oe.Addr.String()
		}
		return cause, "Nomad 1.7+ makes the task API socket in every task's secrets directory; when it cannot, the client logs \"error creating task api socket\" (most often the path is longer than a unix socket allows, 108 bytes: shorten the client's data_dir)"
	}
	return cause, hint
}

// tlsHint says what went wrong in TLS terms a user can act on, and which
// of Nomad's variables changes it.
func tlsHint(err error, status int, caCert string) string {
	return agenttls.Hint(agenttls.Nomad, err, status == http.StatusBadRequest, caCert)
}
