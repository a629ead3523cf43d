package e2e

import (
	"fmt"
	"regexp"
	"strconv"
)

// The production scenario (26) runs only on the newest supported pair:
// Nomad's workload identities for Consul (`nomad setup consul`), the task
// API that install's default -nomad-auth identity uses, and the TLS and ACL
// settings it writes do not exist, or differ, on the oldest pair.

// AgentVersion is an agent's version, major.minor.patch.
type AgentVersion struct{ Major, Minor, Patch int }

// String is "2.0.5".
func (v AgentVersion) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch) }

// Less says whether v is older than o.
func (v AgentVersion) Less(o AgentVersion) bool {
	if v.Major != o.Major {
		return v.Major < o.Major
	}
	if v.Minor != o.Minor {
		return v.Minor < o.Minor
	}
	return v.Patch < o.Patch
}

// NewestNomad and NewestConsul are the newest pair the project tests
// (README): the production scenario needs at least these.
func NewestNomad() AgentVersion  { return AgentVersion{2, 0, 5} }
func NewestConsul() AgentVersion { return AgentVersion{1, 22, 7} }

var versionLine = regexp.MustCompile(`(?m)^(Nomad|Consul) v(\d+)\.(\d+)\.(\d+)`)

// ParseAgentVersion reads the first line of `nomad version` or `consul
// version` ("Nomad v2.0.5", "Consul v1.22.7"); name is "Nomad" or "Consul".
func ParseAgentVersion(name, out string) (AgentVersion, error) {
	for _, m := range versionLine.FindAllStringSubmatch(out, -1) {
		if m[1] != name {
			continue
		}
		var v AgentVersion
		for i, p := range []*int{&v.Major, &v.Minor, &v.Patch} {
			n, err := strconv.Atoi(m[2+i])
			if err != nil {
				return AgentVersion{}, fmt.Errorf("read %s's version from %q: %w", name, out, err)
			}
			*p = n
		}
		return v, nil
	}
	return AgentVersion{}, fmt.Errorf("read %s's version: no line %q in %q", name, name+" vX.Y.Z", out)
}

// NewestPairSkip is the one line scenario 26 skips with when the agents are
// older than the newest pair, "" when they are recent enough.
func NewestPairSkip(nomadV, consulV AgentVersion) string {
	if nomadV.Less(NewestNomad()) || consulV.Less(NewestConsul()) {
		return fmt.Sprintf("e2e 26: SKIPPED: the production install needs Nomad >= %s and Consul >= %s (the newest pair), got Nomad %s and Consul %s: set NOMAD_BIN and CONSUL_BIN to the newest pair",
			NewestNomad(), NewestConsul(), nomadV, consulV)
	}
	return ""
}
