package hcl

import (
	"os"
	"testing"
)

// BenchmarkParse measures parsing and validating the probes example (two
// services, probes, scaling): the cost of every validate, render and deploy.
func BenchmarkParse(b *testing.B) {
	src, err := os.ReadFile("../examples/probes.hcl")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		if _, diags := Parse("probes.hcl", src, Options{}); diags.HasErrors() {
			b.Fatal(diags)
		}
	}
}
