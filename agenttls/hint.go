// Package agenttls words a failed TLS exchange with Nomad or Consul for the
// person who has to fix it: what failed, and which of the agent's
// environment variables to set. nomadjob and consulroute share it, so both
// agents' TLS errors read alike.
package agenttls

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
)

// Agent is Nomad or Consul: whose variables a hint names.
type Agent string

// The two agents.
const (
	Nomad  Agent = "Nomad"
	Consul Agent = "Consul"
)

// env is the name of one of the agent's client variables, as its own CLI
// reads them (NOMAD_CACERT, CONSUL_CACERT...); Consul's address variable
// is CONSUL_HTTP_ADDR.
func (a Agent) env(suffix string) string {
	prefix := strings.ToUpper(string(a))
	if a == Consul && suffix == "ADDR" {
		return prefix + "_HTTP_ADDR"
	}
	return prefix + "_" + suffix
}

// IsTLSError reports whether err is a failed TLS exchange: a handshake
// that either side refused, or TLS spoken to a plain HTTP server. Such an
// error is not transient: a setting is wrong, and retrying only hides it.
func IsTLSError(err error) bool {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	var ve *tls.CertificateVerificationError
	var ae tls.AlertError
	var rh tls.RecordHeaderError
	if errors.As(err, &ua) || errors.As(err, &hn) || errors.As(err, &ci) || errors.As(err, &ve) || errors.As(err, &ae) || errors.As(err, &rh) {
		return true
	}
	// A TLS alert from the server reaches the client as a *net.OpError
	// around an unexported alert type: its text is all there is.
	msg := err.Error()
	return strings.Contains(msg, "remote error: tls:") || strings.Contains(msg, "server gave HTTP response to HTTPS client")
}

// IsPlainToTLS reports whether an HTTP 400's body is Go's TLS server
// refusing a plain HTTP request (the address says http://, the agent
// speaks HTTPS).
func IsPlainToTLS(body string) bool {
	return strings.Contains(body, "HTTP request to an HTTPS server")
}

// Hint words err (IsTLSError, or plainToTLS: the agent answered a plain
// HTTP request with IsPlainToTLS) for a user: what failed and which
// variable to set. caCert is the CA file the client checked the agent's
// certificate with ("" for the system's roots).
func Hint(a Agent, err error, plainToTLS bool, caCert string) string {
	var ua x509.UnknownAuthorityError
	var hn x509.HostnameError
	var ci x509.CertificateInvalidError
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	name, addrVar, caVar, certVar, keyVar := string(a), a.env("ADDR"), a.env("CACERT"), a.env("CLIENT_CERT"), a.env("CLIENT_KEY")
	switch {
	case plainToTLS:
		return fmt.Sprintf("%s speaks HTTPS there and the request was plain HTTP: start %s with https://", name, addrVar)
	case strings.Contains(msg, "server gave HTTP response to HTTPS client"):
		return fmt.Sprintf("%s speaks plain HTTP there and the request was HTTPS: start %s with http://, or turn TLS on in %s's configuration", name, addrVar, name)
	case errors.As(err, &ua):
		if caCert == "" {
			return fmt.Sprintf("%s's certificate is not signed by a CA this machine trusts: set %s to the file of the CA that signed it", name, caVar)
		}
		return fmt.Sprintf("%s's certificate is not signed by the CA in %s (%s): set %s to the file of the CA that signed it", name, caVar, caCert, caVar)
	case errors.As(err, &hn):
		return fmt.Sprintf("%s's certificate is not for the host in %s (%v): set %s to a name the certificate holds", name, addrVar, hn.Error(), a.env("TLS_SERVER_NAME"))
	case errors.As(err, &ci):
		return fmt.Sprintf("%s's certificate is not valid (%v): renew it on the agent", name, ci.Error())
	case strings.Contains(msg, "certificate required"):
		return fmt.Sprintf("%s asks for a client certificate: set %s and %s to a certificate and key signed by %s's CA", name, certVar, keyVar, name)
	case strings.Contains(msg, "bad certificate"), strings.Contains(msg, "unknown certificate authority"), strings.Contains(msg, "certificate expired"):
		return fmt.Sprintf("%s did not accept the client certificate in %s (%s): it must be signed by %s's CA and still valid", name, certVar, lastPart(msg), name)
	}
	return fmt.Sprintf("%s; check %s's scheme and %s, %s, %s", msg, addrVar, caVar, certVar, keyVar)
}

// lastPart is what follows the last ": " of msg (a TLS alert's words).
func lastPart(msg string) string {
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		return msg[i+2:]
	}
	return msg
}
