package h1

import (
	"net/http"
	"net/textproto"
	"strings"
	"testing"

	"golang.org/x/net/http/httpguts"
)

func TestHopByHop(t *testing.T) {
	for _, k := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		if !HopByHop(k) {
			t.Errorf("HopByHop(%q) = false, want true", k)
		}
	}
	for _, k := range []string{"Content-Type", "Host", "X-Forwarded-For", "Traceparent", "connection"} {
		if HopByHop(k) {
			t.Errorf("HopByHop(%q) = true, want false (end-to-end, or not canonical)", k)
		}
	}
}

func TestHasToken(t *testing.T) {
	tests := []struct {
		vv    []string
		token string
		want  bool
	}{
		{[]string{"close"}, "close", true},
		{[]string{"Keep-Alive, Upgrade"}, "upgrade", true},
		{[]string{"keep-alive", " \tUpgrade\t "}, "Upgrade", true},
		{[]string{"closed"}, "close", false},
		{[]string{"x-close, foo"}, "close", false},
		{nil, "close", false},
		{[]string{""}, "close", false},
	}
	for _, tt := range tests {
		if got := HasToken(tt.vv, tt.token); got != tt.want {
			t.Errorf("HasToken(%q, %q) = %v, want %v", tt.vv, tt.token, got, tt.want)
		}
	}
}

func TestCanonicalKeyMatchesTextproto(t *testing.T) {
	for _, k := range []string{"Content-Type", "content-type", "X-FORWARDED-FOR", "Te", "te", "X-Serverless-Revision", "a-b-c", "Www-Authenticate", "-x", ""} {
		if got, want := CanonicalKey(k), textproto.CanonicalMIMEHeaderKey(k); got != want {
			t.Errorf("CanonicalKey(%q) = %q, textproto says %q", k, got, want)
		}
	}
}

func TestCanonicalKeyDoesNotAllocateWhenCanonical(t *testing.T) {
	k := "X-Forwarded-For"
	if n := testing.AllocsPerRun(100, func() { _ = CanonicalKey(k) }); n != 0 {
		t.Errorf("CanonicalKey of a canonical name allocates %v times", n)
	}
}

func TestReplayable(t *testing.T) {
	for m, want := range map[string]bool{
		http.MethodGet: true, http.MethodHead: true, http.MethodOptions: true, http.MethodTrace: true,
		http.MethodPost: false, http.MethodPut: false, http.MethodDelete: false, http.MethodPatch: false, "": false,
	} {
		if got := Replayable(m); got != want {
			t.Errorf("Replayable(%q) = %v, want %v", m, got, want)
		}
	}
}

func TestClientIP(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:5555": "127.0.0.1",
		"[::1]:80":       "::1",
		"[fe80::1%lo]:1": "fe80::1%lo",
		"unix":           "unix",
		"":               "",
	} {
		if got := ClientIP(in); got != want {
			t.Errorf("ClientIP(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTrimOWS(t *testing.T) {
	for in, want := range map[string]string{" a ": "a", "\ta b\t": "a b", "": "", "  ": "", "x": "x"} {
		if got := TrimOWS(in); got != want {
			t.Errorf("TrimOWS(%q) = %q, want %q", in, got, want)
		}
	}
}

// HopByHopName agrees with HopByHop on every spelling of a name.
func TestHopByHopNameAgreesWithHopByHop(t *testing.T) {
	names := []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
		"Content-Type", "Content-Length", "Date", "X-Upgrade", "Tf", "Trailers", "Connectio", ""}
	for _, n := range names {
		for _, spelling := range []string{n, strings.ToLower(n), strings.ToUpper(n)} {
			if got, want := HopByHopName([]byte(spelling)), HopByHop(CanonicalKey(spelling)); got != want {
				t.Errorf("HopByHopName(%q) = %v, HopByHop = %v", spelling, got, want)
			}
		}
	}
	if allocs := testing.AllocsPerRun(100, func() { HopByHopName([]byte("transfer-encoding")) }); allocs != 0 {
		t.Errorf("HopByHopName allocates %.0f times", allocs)
	}
}

func TestValidNameMatchesHTTPGuts(t *testing.T) {
	for _, n := range []string{"Content-Type", "x-a_b.c~d!", "", "Bad Name", "a:b", "tab\there", "ümlaut", "a\x7f", "{x}"} {
		if got, want := ValidName([]byte(n)), httpguts.ValidHeaderFieldName(n); got != want {
			t.Errorf("ValidName(%q) = %v, httpguts says %v", n, got, want)
		}
	}
}

func TestTrimOWSBytes(t *testing.T) {
	for _, s := range []string{"", " ", "\t a \t", "a b", " \tx"} {
		if got, want := string(TrimOWSBytes([]byte(s))), TrimOWS(s); got != want {
			t.Errorf("TrimOWSBytes(%q) = %q, TrimOWS %q", s, got, want)
		}
	}
}
