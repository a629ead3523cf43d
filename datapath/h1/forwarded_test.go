package h1

import (
	"net/http"
	"strings"
	"testing"
)

func TestForwarded(t *testing.T) {
	for _, c := range []struct {
		name        string
		h           http.Header
		ip, host, p string
		want        string
	}{
		{"first hop", http.Header{}, "192.0.2.43", "hello.example.com", "http",
			"for=192.0.2.43;host=hello.example.com;proto=http"},
		{"IPv6 client, host with a port", http.Header{}, "2001:db8::17", "hello.example.com:8080", "https",
			`for="[2001:db8::17]";host="hello.example.com:8080";proto=https`},
		{"extends what came", http.Header{"Forwarded": {"for=198.51.100.17;proto=https", "for=203.0.113.9"}}, "10.0.0.2", "h", "http",
			"for=198.51.100.17;proto=https, for=203.0.113.9, for=10.0.0.2;host=h;proto=http"},
		{"from X-Forwarded-* of a proxy in front", http.Header{
			"X-Forwarded-For":   {"198.51.100.17, 203.0.113.9", "2001:db8::1"},
			"X-Forwarded-Proto": {"https"},
			"X-Forwarded-Host":  {"api.example.com"},
		}, "10.0.0.2", "api.example.com", "http",
			`for=198.51.100.17;host=api.example.com;proto=https, for=203.0.113.9;host=api.example.com;proto=https, for="[2001:db8::1]";host=api.example.com;proto=https, for=10.0.0.2;host=api.example.com;proto=http`},
		{"Forwarded wins over X-Forwarded-For", http.Header{"Forwarded": {"for=a"}, "X-Forwarded-For": {"b"}}, "c", "h", "http",
			"for=a, for=c;host=h;proto=http"},
		{"odd X-Forwarded-For entries are quoted, empty ones skipped", http.Header{"X-Forwarded-For": {`un known, , "x"`}}, "c", "", "http",
			`for="un known", for="\"x\"", for=c;proto=http`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := Forwarded(c.h, c.ip, c.host, c.p); got != c.want {
				t.Errorf("\n got %s\nwant %s", got, c.want)
			}
			var b strings.Builder
			WriteForwarded(&b, c.h, c.ip, c.host, c.p)
			if b.String() != c.want {
				t.Errorf("WriteForwarded: %s", b.String())
			}
		})
	}
}

func TestWriteForwardedAllocatesNothing(t *testing.T) {
	h := http.Header{"X-Forwarded-For": {"198.51.100.17"}, "X-Forwarded-Proto": {"https"}}
	var b strings.Builder
	b.Grow(1024)
	allocs := testing.AllocsPerRun(100, func() {
		b.Reset()
		b.Grow(1024)
		WriteForwarded(&b, h, "10.0.0.2", "hello.example.com", "http")
	})
	// strings.Builder's Grow after Reset allocates its buffer once a run;
	// the writer itself adds nothing.
	if allocs > 1 {
		t.Errorf("%v allocations a run, want at most the builder's one", allocs)
	}
}
