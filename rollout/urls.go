package rollout

import (
	"fmt"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// Where is where a service's names are served: which kind of listener,
// and the address of the first running gateway's (what `deploy`, `status`
// and `list` print). A public service is served on the gateways' public
// port; an internal one (visibility = "internal") on their internal
// listener only, and nowhere on the public ports.
type Where struct {
	// Internal: the names are served on the internal listener only.
	Internal bool `json:"internal,omitempty"`
	// Listener is the address (host:port) the URLs answer on; "" when no
	// running gateway has that kind of listener.
	Listener string `json:"listener,omitempty"`
}

// WhereServed says where a service of that visibility is served by the
// gateways gws (sorted as consulroute.Gateways returns them): the first
// one that has the listener.
func WhereServed(internal bool, gws []consulroute.Gateway) Where {
	w := Where{Internal: internal}
	for _, g := range gws {
		switch {
		case !internal:
			w.Listener = g.HostPort()
		case g.Internal != "":
			w.Listener = g.Internal
		default:
			continue
		}
		return w
	}
	return w
}

// String is how `status` and `deploy` say it.
func (w Where) String() string {
	switch {
	case w.Internal && w.Listener == "":
		return "internal: no running gateway has an internal listener (serve -internal-listen); mesh clients reach the service by its name"
	case w.Internal:
		return fmt.Sprintf("internal, on the gateways' internal listener (%s); the public ports answer its names as unknown hosts", w.Listener)
	case w.Listener == "":
		return "public: no gateway is running (nomad-serverless serve)"
	}
	return fmt.Sprintf("public, on the gateways' port (%s)", w.Listener)
}

// serviceURLs are the http:// URLs of a record's names under domain: its
// own host, its domains, then its tags' hosts.
func serviceURLs(rec consulroute.Record, domain string) []string {
	svc := rec.Service
	ns := rec.Namespace()
	out := []string{fmt.Sprintf("http://%s.%s.%s/", svc.Name, ns, domain)}
	for _, d := range svc.Domains {
		out = append(out, "http://"+d+"/")
	}
	if route, err := rec.Route(); err == nil {
		for _, tag := range sortedTags(route.Tags) {
			out = append(out, fmt.Sprintf("http://%s-%s.%s.%s/", tag, svc.Name, ns, domain))
		}
	}
	return out
}
