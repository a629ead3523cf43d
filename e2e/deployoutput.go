package e2e

import (
	"regexp"
	"strconv"
	"strings"
)

// DeployOutput is what `nomad-serverless deploy` printed, read back line by
// line (the formats of rollout/deploy.go). Progress lines and
// anything unknown are skipped.
type DeployOutput struct {
	Text string
	// Registered maps each new revision to its generation
	// ("hello-00002: registered (generation 2)").
	Registered map[string]int
	// Unchanged lists the revisions deploy found unchanged ("hello-00001:
	// template unchanged; no new revision" or "...; scaling settings
	// updated in place").
	Unchanged []string
	// Ready maps each revision deploy waited for to what it saw
	// ("hello-00001: ready (1/1 instances passing) in 2.3s").
	Ready map[string]Ready
	// Routes maps each service to the traffic deploy published
	// ("hello: route published (hello-00001 90%, hello-00002 10%, tag
	// stable -> hello-00001)").
	Routes map[string]string
	// URLs maps each service to where the gateway serves it ("hello:
	// http://hello.default.localhost/  (curl -H 'Host:
	// hello.default.localhost' http://127.0.0.1:8080/)").
	URLs map[string]ServiceURL
	// Deleted lists old revisions deploy garbage-collected.
	Deleted []string
}

// Ready is one "ready (passing/want instances passing)" line.
type Ready struct{ Passing, Want int }

// ServiceURL is one URL line: the service's URL, its Host and the gateway
// address the curl hint sends it to.
type ServiceURL struct{ URL, Host, Gateway string }

var (
	deployRegisteredRE = regexp.MustCompile(`^(\S+): registered \(generation (\d+)\)$`)
	deployUnchangedRE  = regexp.MustCompile(`^(\S+): template unchanged; `)
	deployReadyRE      = regexp.MustCompile(`^(\S+): ready \((\d+)/(\d+) instances passing\)`)
	deployRouteRE      = regexp.MustCompile(`^(\S+): route published \((.*)\)$`)
	deployURLRE        = regexp.MustCompile(`^(\S+): (http://(\S+)/)  \(curl -H 'Host: (\S+)' http://(\S+)/\)$`)
	deployDeletedRE    = regexp.MustCompile(`^\S+: deleted old revision (\S+) `)
)

// ParseDeployOutput reads deploy's standard output.
func ParseDeployOutput(text string) DeployOutput {
	d := DeployOutput{Text: text, Registered: map[string]int{}, Ready: map[string]Ready{}, Routes: map[string]string{}, URLs: map[string]ServiceURL{}}
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimRight(line, "\r")
		if m := deployRegisteredRE.FindStringSubmatch(line); m != nil {
			d.Registered[m[1]], _ = strconv.Atoi(m[2])
		} else if m := deployUnchangedRE.FindStringSubmatch(line); m != nil {
			d.Unchanged = append(d.Unchanged, m[1])
		} else if m := deployReadyRE.FindStringSubmatch(line); m != nil {
			passing, _ := strconv.Atoi(m[2])
			want, _ := strconv.Atoi(m[3])
			d.Ready[m[1]] = Ready{Passing: passing, Want: want}
		} else if m := deployRouteRE.FindStringSubmatch(line); m != nil {
			d.Routes[m[1]] = m[2]
		} else if m := deployURLRE.FindStringSubmatch(line); m != nil && m[3] == m[4] {
			d.URLs[m[1]] = ServiceURL{URL: m[2], Host: m[4], Gateway: m[5]}
		} else if m := deployDeletedRE.FindStringSubmatch(line); m != nil {
			d.Deleted = append(d.Deleted, m[1])
		}
	}
	return d
}
