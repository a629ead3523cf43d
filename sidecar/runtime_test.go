package sidecar

import (
	"runtime"
	"testing"
)

func TestSetRuntimeDefaults(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == "GOMAXPROCS" {
				return v
			}
			return ""
		}
	}
	runtime.GOMAXPROCS(8)
	if got := SetRuntimeDefaults(env("")); got != MaxProcs {
		t.Errorf("8 Ps, no GOMAXPROCS in the environment: %d Ps after, want %d", got, MaxProcs)
	}
	runtime.GOMAXPROCS(8)
	if got := SetRuntimeDefaults(env("8")); got != 8 {
		t.Errorf("GOMAXPROCS=8 in the environment: %d Ps after, want 8", got)
	}
	runtime.GOMAXPROCS(1)
	if got := SetRuntimeDefaults(env("")); got != 1 {
		t.Errorf("1 P (one core): %d Ps after, want 1", got)
	}
}
