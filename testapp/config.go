package testapp

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// Environment variables that configure the test app. Every duration is a Go
// duration ("250ms", "2s").
const (
	EnvPort       = "PORT"                 // where to listen on 127.0.0.1 (required)
	EnvHost       = "TESTAPP_HOST"         // listen address, default 127.0.0.1
	EnvStartDelay = "TESTAPP_START_DELAY"  // wait this long before listening
	EnvReadyDelay = "TESTAPP_READY_DELAY"  // /ready answers 503 until this long after start
	EnvSleep      = "TESTAPP_SLEEP"        // every work request sleeps this long
	EnvCPU        = "TESTAPP_CPU"          // every work request burns this much CPU
	EnvNotReady   = "TESTAPP_FAIL_READY"   // "true": /ready fails until POST /ready-ok
	EnvName       = "TESTAPP_NAME"         // echoed in the X-Testapp-Name response header
	EnvGraceStop  = "TESTAPP_STOP_TIMEOUT" // on SIGTERM, wait this long for requests (default 5s)
	// EnvFailPercent makes that share of work requests without a status
	// query answer 500, spread evenly: a revision that passes readiness
	// and then fails some requests (the rollout scenario's bad revision).
	EnvFailPercent = "TESTAPP_FAIL_PERCENT"
)

// Config is the test app's configuration.
type Config struct {
	// Tracing, if set, makes every request a span of the app's own
	// (tracing.go); the binary sets it from the OTEL_* environment.
	Tracing *tracing.Provider

	Host       string
	Port       int
	StartDelay time.Duration
	ReadyDelay time.Duration
	Sleep      time.Duration
	CPU        time.Duration
	FailReady  bool
	Name       string
	StopGrace  time.Duration
	// FailPercent of work requests answer 500 (EnvFailPercent).
	FailPercent int
}

// ConfigFromEnv reads the configuration; getenv is os.Getenv in the binary.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := Config{Host: "127.0.0.1", StopGrace: 5 * time.Second, Name: getenv(EnvName)}
	var errs []error
	if v := getenv(EnvHost); v != "" {
		c.Host = v
	}
	p := getenv(EnvPort)
	n, err := strconv.Atoi(p)
	if err != nil || n < 1 || n > 65535 {
		errs = append(errs, fmt.Errorf("%s=%q: want a port from 1 to 65535", EnvPort, p))
	}
	c.Port = n
	dur := func(name string, dst *time.Duration) {
		v := getenv(name)
		if v == "" {
			return
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("%s=%q: want a duration such as \"250ms\"", name, v))
			return
		}
		*dst = d
	}
	dur(EnvStartDelay, &c.StartDelay)
	dur(EnvReadyDelay, &c.ReadyDelay)
	dur(EnvSleep, &c.Sleep)
	dur(EnvCPU, &c.CPU)
	dur(EnvGraceStop, &c.StopGrace)
	if v := getenv(EnvFailPercent); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			errs = append(errs, fmt.Errorf("%s=%q: want a whole percentage from 0 to 100", EnvFailPercent, v))
		}
		c.FailPercent = n
	}
	switch v := getenv(EnvNotReady); v {
	case "", "false", "0":
	case "true", "1":
		c.FailReady = true
	default:
		errs = append(errs, fmt.Errorf("%s=%q: want true or false", EnvNotReady, v))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("testapp configuration: %w", errors.Join(errs...))
	}
	return c, nil
}
