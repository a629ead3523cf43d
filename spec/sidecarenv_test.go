package spec

import (
	"reflect"
	"strings"
	"testing"
	"time"
)

// envOf returns SidecarConfig.Env() plus the three ports, as the compiler
// writes them into the sidecar task.
func envOf(c SidecarConfig, port, app, admin string) map[string]string {
	env := c.Env()
	env[EnvSidecarPort] = port
	env[EnvSidecarAppPort] = app
	env[EnvSidecarAdminPort] = admin
	return env
}

func getenvFrom(env map[string]string) func(string) string {
	return func(k string) string { return env[k] }
}

func TestSidecarEnvRoundTrip(t *testing.T) {
	withProbes := baseService()
	live := DefaultProbe(ProbeExec)
	live.Command = []string{"/bin/check", "--deep"}
	live.Period = DefaultLivenessPeriod
	withProbes.Template.Liveness = &live
	withProbes.Template.Readiness.Headers = map[string]string{"X-Probe": "yes"}
	withProbes.Template.ResponseStartTimeout = 5 * time.Second
	withProbes.Template.IdleTimeout = 30 * time.Second

	bare := NewService("bare")
	bare.Template.Task.Driver = "exec"
	bare.Template.Task.KillTimeout = time.Second // drain budget 0

	slow := baseService()
	slow.Template.Task.KillTimeout = 5 * time.Second
	slow.Template.Concurrency = 0

	grpc := baseService()
	grpc.Template.Task.Protocol = ProtocolH2C

	for name, s := range map[string]Service{"probes": withProbes, "bare": bare, "slow kill": slow, "h2c app": grpc} {
		t.Run(name, func(t *testing.T) {
			want := SidecarConfigForRevision(NewRevision(&s, 3))
			want.Instance = "0b1f-alloc"
			want.AccessLog = true
			got, err := ParseSidecarEnv(getenvFrom(envOf(want, "20001", "20002", "20003")))
			if err != nil {
				t.Fatalf("ParseSidecarEnv: %v", err)
			}
			want.Port, want.AppPort, want.AdminPort = 20001, 20002, 20003
			if !reflect.DeepEqual(got, want) {
				t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func TestSidecarConfigForRevision(t *testing.T) {
	s := baseService()
	s.Template.Concurrency = 4
	s.Template.Task.KillTimeout = 30 * time.Second
	c := SidecarConfigForRevision(NewRevision(&s, 2))
	if c.Revision != "hello-00002" || c.Service != "hello" || c.QueueDepth != 4*DefaultQueueDepthFactor ||
		c.DrainTimeout != 29*time.Second || c.DrainGrace != 3*time.Second || c.Readiness != s.Template.Readiness {
		t.Errorf("config = %+v", c)
	}
	// The drain always ends before Nomad's kill.
	for _, kill := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, time.Minute} {
		s.Template.Task.KillTimeout = kill
		c := SidecarConfigForRevision(NewRevision(&s, 2))
		if c.DrainTimeout >= kill || c.DrainGrace > c.DrainTimeout || c.DrainGrace < 0 {
			t.Errorf("kill %s: drain %s grace %s", kill, c.DrainTimeout, c.DrainGrace)
		}
	}
}

func TestParseSidecarEnvDefaults(t *testing.T) {
	env := map[string]string{
		EnvSidecarPort: "1", EnvSidecarAppPort: "2", EnvSidecarAdminPort: "3",
		EnvSidecarService: "hello", EnvSidecarRevision: "hello-00001", EnvSidecarConcurrency: "5",
	}
	c, err := ParseSidecarEnv(getenvFrom(env))
	if err != nil {
		t.Fatal(err)
	}
	if c.Timeout != DefaultTimeout || c.QueueDepth != 5*DefaultQueueDepthFactor || c.Readiness != nil || c.Liveness != nil ||
		c.DrainGrace != 3*time.Second || c.DrainTimeout != DefaultKillTimeout-time.Second || c.AccessLog || c.AppProtocol != "" {
		t.Errorf("defaults = %+v", c)
	}
}

// Each bad variable is reported by name; several are reported at once.
func TestParseSidecarEnvReportsEachVariable(t *testing.T) {
	good := func() map[string]string {
		s := baseService()
		return envOf(SidecarConfigForRevision(NewRevision(&s, 1)), "1", "2", "3")
	}
	for _, tc := range []struct {
		name  string
		key   string
		value string // "" removes the variable
		want  string // substring of the error besides the variable name
	}{
		{"port missing", EnvSidecarPort, "", "is not set"},
		{"port word", EnvSidecarPort, "http", "port from 1 to 65535"},
		{"app port range", EnvSidecarAppPort, "70000", "port from 1 to 65535"},
		{"app port missing", EnvSidecarAppPort, "", "is not set"},
		{"admin port zero", EnvSidecarAdminPort, "0", "port from 1 to 65535"},
		{"concurrency negative", EnvSidecarConcurrency, "-1", "whole number"},
		{"queue depth word", EnvSidecarQueueDepth, "deep", "whole number"},
		{"timeout bare number", EnvSidecarTimeout, "30", "duration"},
		{"timeout zero", EnvSidecarTimeout, "0s", "positive duration"},
		{"response start negative", EnvSidecarRespStart, "-1s", "duration"},
		{"idle word", EnvSidecarIdle, "long", "duration"},
		{"readiness not JSON", EnvSidecarReadiness, "{", "JSON probe"},
		{"readiness unknown field", EnvSidecarReadiness, `{"type":"http","path":"/","timeout":1000000000,"success_threshold":1,"failure_threshold":1,"bogus":1}`, "bogus"},
		{"readiness invalid probe", EnvSidecarReadiness, `{"type":"udp","timeout":1000000000,"success_threshold":1,"failure_threshold":1}`, `"udp" is not supported`},
		{"liveness invalid probe", EnvSidecarLiveness, `{"type":"http","path":"x","timeout":1000000000,"success_threshold":1,"failure_threshold":1}`, "does not start with '/'"},
		{"drain grace word", EnvSidecarDrainGrace, "soon", "duration"},
		{"drain timeout negative", EnvSidecarDrainLimit, "-5s", "duration"},
		{"drain grace over timeout", EnvSidecarDrainGrace, "1h", "longer than"},
		{"access log", EnvSidecarAccessLog, "maybe", "true or false"},
		{"app protocol", EnvSidecarAppProtocol, "h2", "want h2c, or http1"},
		{"service missing", EnvSidecarService, "", "is not set"},
		{"revision missing", EnvSidecarRevision, "", "is not set"},
		{"ports equal", EnvSidecarAdminPort, "2", "ports must differ"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := good()
			if tc.value == "" {
				delete(env, tc.key)
			} else {
				env[tc.key] = tc.value
			}
			_, err := ParseSidecarEnv(getenvFrom(env))
			if err == nil {
				t.Fatalf("%s=%q accepted", tc.key, tc.value)
			}
			if !strings.Contains(err.Error(), tc.key) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not name %s with %q", err, tc.key, tc.want)
			}
		})
	}

	env := good()
	env[EnvSidecarPort] = "x"
	env[EnvSidecarTimeout] = "y"
	env[EnvSidecarAccessLog] = "z"
	delete(env, EnvSidecarRevision)
	_, err := ParseSidecarEnv(getenvFrom(env))
	if err == nil {
		t.Fatal("several bad variables accepted")
	}
	for _, k := range []string{EnvSidecarPort, EnvSidecarTimeout, EnvSidecarAccessLog, EnvSidecarRevision} {
		if !strings.Contains(err.Error(), k) {
			t.Errorf("error does not name %s: %v", k, err)
		}
	}
}
