package spec

import (
	"testing"
	"time"
)

// A rollout moves the latest targets' share, and only when it has a
// duration or steps.
func TestRolloutActiveAndLatestPercent(t *testing.T) {
	for _, tc := range []struct {
		r      *Rollout
		active bool
	}{
		{nil, false},
		{&Rollout{Analysis: DefaultAnalysis()}, false},
		{&Rollout{Duration: time.Minute}, true},
		{&Rollout{Steps: []int{50}}, true},
	} {
		if got := tc.r.Active(); got != tc.active {
			t.Errorf("%+v: active %v, want %v", tc.r, got, tc.active)
		}
	}
	s := NewService("hello")
	if got := s.LatestPercent(); got != 100 {
		t.Errorf("no traffic list: latest holds %d%%, want all", got)
	}
	s.Traffic = []TrafficTarget{{Revision: "hello-00001", Percent: 70}, {Latest: true, Percent: 20}, {Latest: true, Percent: 10, Tag: "next"}, {Latest: true, Tag: "head"}}
	if got := s.LatestPercent(); got != 30 {
		t.Errorf("latest holds %d%%, want 30", got)
	}
}

func TestLatencyBoundString(t *testing.T) {
	for _, tc := range []struct {
		b    LatencyBound
		want string
	}{
		{LatencyBound{}, ""},
		{LatencyBound{Factor: 1.5}, "1.5x"},
		{LatencyBound{Absolute: 300 * time.Millisecond}, "300ms"},
		{LatencyBound{Factor: 2, Absolute: time.Second}, "2x, 1s"},
	} {
		if got := tc.b.String(); got != tc.want || tc.b.IsZero() != (tc.want == "") {
			t.Errorf("%+v: %q (zero %v), want %q", tc.b, got, tc.b.IsZero(), tc.want)
		}
	}
}
