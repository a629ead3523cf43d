package e2e

import (
	"strings"
	"testing"
)

func TestUnitParseAgentVersion(t *testing.T) {
	for _, c := range []struct {
		name, out, want string
		err             bool
	}{
		{"Nomad", "Nomad v2.0.5\nBuildDate 2026-08-12T18:22:41Z\n", "2.0.5", false},
		{"Consul", "Consul v1.22.7\nBuild Date 1970-01-01T00:00:01Z\n", "1.22.7", false},
		{"Nomad", "Nomad v1.6.5\n", "1.6.5", false},
		{"Nomad", "Consul v1.22.7\n", "", true},
		{"Nomad", "", "", true},
	} {
		v, err := ParseAgentVersion(c.name, c.out)
		if (err != nil) != c.err {
			t.Errorf("ParseAgentVersion(%q, %q): error %v, want error %v", c.name, c.out, err, c.err)
			continue
		}
		if !c.err && v.String() != c.want {
			t.Errorf("ParseAgentVersion(%q, %q) = %s, want %s", c.name, c.out, v, c.want)
		}
	}
}

func TestUnitNewestPairSkip(t *testing.T) {
	if s := NewestPairSkip(AgentVersion{2, 0, 5}, AgentVersion{1, 22, 7}); s != "" {
		t.Errorf("newest pair: skip %q, want none", s)
	}
	if s := NewestPairSkip(AgentVersion{2, 1, 0}, AgentVersion{1, 23, 0}); s != "" {
		t.Errorf("newer pair: skip %q, want none", s)
	}
	s := NewestPairSkip(AgentVersion{1, 6, 5}, AgentVersion{1, 16, 1})
	if !strings.HasPrefix(s, "e2e 26: SKIPPED:") || strings.Contains(s, "\n") || !strings.Contains(s, "Nomad 1.6.5") {
		t.Errorf("oldest pair: skip %q, want one line naming the versions", s)
	}
}
