package main

import "testing"

func TestLineNamesTheSeriesAndSize(t *testing.T) {
	for _, tc := range []struct{ in, name, n, ns string }{
		{"BenchmarkScaleTick/revisions=10000/changing-2         	       5	 127702865 ns/op	30.94 cpu-ms/tick", "BenchmarkScaleTick", "10000", "127702865"},
		{"BenchmarkScaleRouteTable/revisions=1000-2         	       3	   4425347 ns/op", "BenchmarkScaleRouteTable", "1000", "4425347"},
	} {
		m := line.FindStringSubmatch(tc.in)
		if m == nil || m[1] != tc.name || m[2] != tc.n || m[5] != tc.ns {
			t.Errorf("%q: %q", tc.in, m)
		}
	}
	if line.FindStringSubmatch("BenchmarkTick10kRevisions-2  5  100 ns/op") != nil {
		t.Error("a benchmark without revisions=N matched")
	}
}
