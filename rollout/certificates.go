package rollout

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/certs"
)

// Certificates asks every running gateway for the certificates of a
// service's names (namespace/service; all names when service is "") and
// merges what they say: per name, the certificate that expires last (a
// replica that has not picked up a renewal yet shows the older one), and
// the newest failure any replica had ordering or renewing it. Gateways
// that do not answer are left out; none answering is no error, just no
// rows.
func (in *Inspector) Certificates(ctx context.Context, namespace, service string) []certs.NameStatus {
	gws, err := in.consul.Gateways(ctx)
	if err != nil {
		return nil
	}
	var views [][]certs.NameStatus
	for _, g := range gws {
		if g.AdminPort == 0 {
			continue
		}
		u := url.URL{Scheme: "http", Host: g.AdminHostPort(), Path: certs.AdminPath}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
		if err != nil {
			continue
		}
		resp, err := in.http.Do(req)
		if err != nil {
			continue
		}
		var v []certs.NameStatus
		if resp.StatusCode == http.StatusOK {
			err = json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&v)
		}
		resp.Body.Close()
		if err == nil {
			views = append(views, v)
		}
	}
	return mergeCertificates(views, namespace, service)
}

// mergeCertificates merges the replicas' views of the names of one service
// (see Certificates), sorted by name.
func mergeCertificates(views [][]certs.NameStatus, namespace, service string) []certs.NameStatus {
	byName := map[string]certs.NameStatus{}
	for _, v := range views {
		for _, s := range v {
			if service != "" && (s.Service != service || s.Namespace != namespace) {
				continue
			}
			cur, ok := byName[s.Name]
			if !ok {
				byName[s.Name] = s
				continue
			}
			next := cur
			if s.NotAfter.After(cur.NotAfter) {
				next = s
			}
			// The newest failure, from whichever replica had it.
			next.LastError, next.LastErrorAt, next.Replica = cur.LastError, cur.LastErrorAt, cur.Replica
			if s.LastErrorAt.After(cur.LastErrorAt) {
				next.LastError, next.LastErrorAt, next.Replica = s.LastError, s.LastErrorAt, s.Replica
			}
			byName[s.Name] = next
		}
	}
	out := make([]certs.NameStatus, 0, len(byName))
	for _, s := range byName {
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b certs.NameStatus) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// httpsURLs puts an https:// URL before each http:// one whose name has a
// valid certificate.
func httpsURLs(urls []string, cs []certs.NameStatus) []string {
	valid := map[string]bool{}
	for _, c := range cs {
		if c.State == "valid" {
			valid[c.Name] = true
		}
	}
	if len(valid) == 0 {
		return urls
	}
	out := make([]string, 0, 2*len(urls))
	for _, u := range urls {
		if rest, ok := strings.CutPrefix(u, "http://"); ok && valid[strings.TrimSuffix(rest, "/")] {
			out = append(out, "https://"+rest)
		}
		out = append(out, u)
	}
	return out
}
