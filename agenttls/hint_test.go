package agenttls

import (
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestHintNamesTheAgentsVariables(t *testing.T) {
	unknownCA := fmt.Errorf("Get \"https://127.0.0.1:8501/v1/kv/x\": %w", &tlsFailure{x509.UnknownAuthorityError{}})
	for _, tc := range []struct {
		name       string
		agent      Agent
		err        error
		plainToTLS bool
		caCert     string
		want       string
		tls        bool
	}{
		{"Consul, another CA", Consul, unknownCA, false, "/etc/ca.pem",
			"Consul's certificate is not signed by the CA in CONSUL_CACERT (/etc/ca.pem): set CONSUL_CACERT to the file of the CA that signed it", true},
		{"Nomad, the system's roots", Nomad, unknownCA, false, "",
			"Nomad's certificate is not signed by a CA this machine trusts: set NOMAD_CACERT", true},
		{"Consul asks for a client certificate", Consul, errors.New("read tcp 127.0.0.1:1->127.0.0.1:2: remote error: tls: certificate required"), false, "",
			"Consul asks for a client certificate: set CONSUL_CLIENT_CERT and CONSUL_CLIENT_KEY", true},
		{"Consul refuses the client certificate", Consul, errors.New("remote error: tls: unknown certificate authority"), false, "",
			"Consul did not accept the client certificate in CONSUL_CLIENT_CERT (unknown certificate authority)", true},
		{"plain HTTP to Consul's HTTPS", Consul, nil, true, "",
			"Consul speaks HTTPS there and the request was plain HTTP: start CONSUL_HTTP_ADDR with https://", false},
		{"HTTPS to a plain Nomad", Nomad, errors.New("http: server gave HTTP response to HTTPS client"), false, "",
			"Nomad speaks plain HTTP there and the request was HTTPS: start NOMAD_ADDR with http://", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Hint(tc.agent, tc.err, tc.plainToTLS, tc.caCert); !strings.Contains(got, tc.want) {
				t.Errorf("Hint = %q\nwant it to hold %q", got, tc.want)
			}
			if tc.err != nil && IsTLSError(tc.err) != tc.tls {
				t.Errorf("IsTLSError(%v) = %v", tc.err, !tc.tls)
			}
		})
	}
	if IsTLSError(errors.New("dial tcp 127.0.0.1:8500: connect: connection refused")) {
		t.Error("a refused connection is not a TLS error")
	}
	if !IsPlainToTLS("Client sent an HTTP request to an HTTPS server.\n") {
		t.Error("Go's TLS server's answer to plain HTTP is not recognised")
	}
}

// tlsFailure wraps a verification error as crypto/tls does.
type tlsFailure struct{ err error }

func (e *tlsFailure) Error() string { return "tls: failed to verify certificate: " + e.err.Error() }
func (e *tlsFailure) Unwrap() error { return e.err }
