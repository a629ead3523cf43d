package consulroute_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// A 403 says which token setting to change, from Consul's words and
// whether a token was sent, and names the policy to grant.
func TestPermissionHints(t *testing.T) {
	for _, tc := range []struct {
		name, consulSays, token, policy string
		want                            string
	}{
		{"no token", `Permission denied: anonymous token lacks permission 'key:read' on "nomad-serverless/services/default/hello". The anonymous token is used implicitly when a request does not specify a token.`, "", "nomad-serverless-deploy",
			`CONSUL_HTTP_TOKEN is not set, and Consul's anonymous token lacks key:read on "nomad-serverless/services/default/hello": set CONSUL_HTTP_TOKEN to the secret ID of a token with the policy nomad-serverless-deploy that ` + "`nomad-serverless install -out`" + ` writes`},
		{"a token without the permission", `Permission denied: token with AccessorID '0b1f' lacks permission 'service:write' on "hello"`, "secret", "nomad-serverless-deploy",
			`the token in CONSUL_HTTP_TOKEN lacks service:write on "hello": grant it the policy nomad-serverless-deploy that ` + "`nomad-serverless install -out`" + ` writes`},
		{"an expired or unknown token", "ACL not found", "secret", "nomad-serverless-control-plane",
			"Consul does not know the token in CONSUL_HTTP_TOKEN: it has expired, or was deleted, or is from another cluster: set CONSUL_HTTP_TOKEN to the secret ID of a token with the policy nomad-serverless-control-plane"},
		{"no policy named", `Permission denied: token with AccessorID '0b1f' lacks permission 'key:read' on "x"`, "secret", "",
			`grant the token in CONSUL_HTTP_TOKEN key:read on "x"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Error(w, tc.consulSays, http.StatusForbidden)
			}))
			t.Cleanup(srv.Close)
			c, err := consulroute.NewClient(&api.Config{Address: srv.URL, Token: tc.token}, consulroute.WithPolicy(tc.policy))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.KVGet(ctx, "nomad-serverless/services/default/hello")
			if !errors.Is(err, consulroute.ErrPermissionDenied) {
				t.Fatalf("err = %v, want ErrPermissionDenied", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("message = %q\nwant it to hold %q", err, tc.want)
			}
		})
	}
}

// A plain HTTP request to Consul's HTTPS port says to use https://.
func TestPlainHTTPToConsulsHTTPS(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	c, err := consulroute.NewClient(&api.Config{Address: strings.TrimPrefix(srv.URL, "https://"), Scheme: "http"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.KVGet(ctx, "x")
	if err == nil || !strings.Contains(err.Error(), "Consul speaks HTTPS there and the request was plain HTTP: start CONSUL_HTTP_ADDR with https://") {
		t.Errorf("err = %v", err)
	}
}

// A certificate Consul's client does not trust reads as what to set, not
// as Consul being unreachable.
func TestConsulCertificateFromAnotherCA(t *testing.T) {
	srv := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(srv.Close)
	c, err := consulroute.NewClient(&api.Config{Address: strings.TrimPrefix(srv.URL, "https://"), Scheme: "https"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = c.KVGet(ctx, "x")
	want := "read x: cannot talk to Consul at " + srv.URL + " over TLS: Consul's certificate is not signed by a CA this machine trusts: set CONSUL_CACERT"
	if !errors.Is(err, consulroute.ErrTLS) || errors.Is(err, consulroute.ErrUnreachable) || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("err = %v\nwant it to start %q", err, want)
	}
}
