package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// recordedNomad answers, over real HTTP on loopback, what a Nomad holding
// n revision jobs at rest would: the job listing (with meta when asked),
// each from the recorded stub of nomad-1.6/063, and each job from the
// recorded job read of nomad-1.6/003, with its ID. The answers are
// encoded once: what is measured is the client's side (requests, JSON
// decoding, the catalog), not a Nomad server's.
func recordedNomad(b *testing.B, n int) *httptest.Server {
	b.Helper()
	var stubs []map[string]any
	if err := json.Unmarshal(fixtures.Load(b, "nomad-1.6/063-jobs-list-with-meta.json").Response.BodyBytes(), &stubs); err != nil {
		b.Fatal(err)
	}
	stub := stubs[1] // idle-00001: at rest
	var job struct{ JobModifyIndex float64 }
	if err := json.Unmarshal(fixtures.Load(b, "nomad-1.6/003-job-read.json").Response.BodyBytes(), &job); err != nil {
		b.Fatal(err)
	}
	stub["JobModifyIndex"] = job.JobModifyIndex // the job as read is the job as listed
	var jobTemplate bytes.Buffer
	if err := json.Compact(&jobTemplate, fixtures.Load(b, "nomad-1.6/003-job-read.json").Response.BodyBytes()); err != nil {
		b.Fatal(err)
	}
	encode := func(meta bool) []byte {
		var buf bytes.Buffer
		buf.WriteByte('[')
		for i := range n {
			name := fmt.Sprintf("s%06d-00001", i)
			s := make(map[string]any, len(stub))
			for k, v := range stub {
				s[k] = v
			}
			s["ID"], s["Name"] = name, name
			m := map[string]any{}
			for k, v := range stub["Meta"].(map[string]any) {
				m[k] = v
			}
			m["serverless.service"], m["serverless.revision"] = name[:7], name
			if meta {
				s["Meta"] = m
			} else {
				delete(s, "Meta")
			}
			if i > 0 {
				buf.WriteByte(',')
			}
			enc, _ := json.Marshal(s)
			buf.Write(enc)
		}
		buf.WriteByte(']')
		return buf.Bytes()
	}
	withMeta, withoutMeta := encode(true), encode(false)
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("X-Nomad-Index", "100")
		switch {
		case r.URL.Path == "/v1/jobs" && r.URL.Query().Get("meta") == "true":
			_, _ = w.Write(withMeta)
		case r.URL.Path == "/v1/jobs":
			_, _ = w.Write(withoutMeta)
		case strings.HasSuffix(r.URL.Path, "/allocations"):
			_, _ = w.Write([]byte("[]"))
		case strings.HasPrefix(r.URL.Path, "/v1/job/"):
			name := strings.TrimPrefix(r.URL.Path, "/v1/job/")
			body := bytes.ReplaceAll(jobTemplate.Bytes(), []byte(`"hello-00001"`), []byte(`"`+name+`"`))
			body = bytes.ReplaceAll(body, []byte(`"hello"`), []byte(`"`+name[:7]+`"`))
			_, _ = w.Write(body)
		default:
			http.NotFound(w, r)
		}
	}))
}

// BenchmarkScaleTimeToRoutable is how long a starting serve takes, at n
// revisions at rest, before its catalog is listed and the gateway routes
// (issue 45: 40.2 s at 10,000 on real agents): "today" is the listing and
// a read of every job (4 at a time) before the catalog counts as listed,
// as serve did; "listed" is the first phase now, one listing with meta;
// "whole" is both phases, every job read too (in serve that happens after
// the gateway routes, in the background).
func BenchmarkScaleTimeToRoutable(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1_000, 10_000, 100_000} {
		srv := recordedNomad(b, n)
		cfg := api.DefaultConfig()
		cfg.Address = srv.URL
		nc, err := nomadjob.NewClient(cfg)
		if err != nil {
			b.Fatal(err)
		}
		nc.SetLogger(quietLog)
		b.Run(fmt.Sprintf("revisions=%d/today", n), func(b *testing.B) {
			for b.Loop() {
				revs, _, err := nc.AllRevisions(ctx)
				if err != nil || len(revs) != n {
					b.Fatalf("%d revisions, %v", len(revs), err)
				}
				cat := catalog.New()
				for _, r := range revs {
					cat.SetRevision(catalogRevision(r.RevisionInfo))
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s-to-routable")
		})
		b.Run(fmt.Sprintf("revisions=%d/listed", n), func(b *testing.B) {
			for b.Loop() {
				cat := catalog.New()
				_, pending, err := listNomad(ctx, nc, cat, newRevisionTags(), newJobReads(), quietLog)
				if err != nil || len(pending) != n {
					b.Fatalf("%d to read, %v", len(pending), err)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s-to-routable")
		})
		b.Run(fmt.Sprintf("revisions=%d/whole", n), func(b *testing.B) {
			for b.Loop() {
				cat, tags, known := catalog.New(), newRevisionTags(), newJobReads()
				_, pending, err := listNomad(ctx, nc, cat, tags, known, quietLog)
				if err != nil {
					b.Fatal(err)
				}
				if made := readJobs(ctx, nc, cat, tags, known, pending, quietLog); made != n {
					b.Fatalf("%d of %d whole", made, n)
				}
			}
			b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s-to-whole")
		})
		nc.API().Close()
		srv.Close()
	}
}
