package testbin

import (
	"os"
	"strconv"
	"time"
)

// EnvTimeoutScale multiplies every hang bound a test takes from Bound (and
// the timeouts of Eventually, WaitPort and Proc.WaitPort): a number such
// as 3 or 0.5, default 1. A machine slower than any bound foresees (an
// emulator, a CI runner shared ten ways) sets it instead of editing tests.
const EnvTimeoutScale = "NOMAD_SERVERLESS_TEST_TIMEOUT_SCALE"

// Bound is d scaled by EnvTimeoutScale. A test uses it for a deadline that
// only ends a wait which would otherwise hang: a deadline that passes on a
// busy machine is a failure of the test, not of the code, so such a
// deadline is generous (many times what the wait takes on an idle
// machine) and never what the test asserts. What a test asserts is order
// and cause; how fast something goes belongs in a benchmark.
func Bound(d time.Duration) time.Duration {
	return time.Duration(float64(d) * timeoutScale())
}

func timeoutScale() float64 {
	s := os.Getenv(EnvTimeoutScale)
	if s == "" {
		return 1
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f <= 0 {
		panic("testbin: " + EnvTimeoutScale + "=" + s + ": want a positive number")
	}
	return f
}
