package tracing

import (
	"os"
	"sort"
	"strings"
)

// Enabled reports whether the environment (getenv) names an OTLP
// endpoint for traces and does not switch the traces exporter off:
// without one nothing is exported, so nothing is traced.
func Enabled(getenv func(string) string) bool {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")), "none") ||
		strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Settings are the OTEL_* variables of environ ("K=V" strings, as from
// os.Environ) that configure tracing, to pass on to another process (the
// control plane's job, the revisions' sidecars). OTEL_SERVICE_NAME is
// left out: each process names itself.
func Settings(environ []string) map[string]string {
	out := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(k, "OTEL_") || k == "OTEL_SERVICE_NAME" {
			continue
		}
		out[k] = v
	}
	return out
}

// ProcessSettings is Settings of this process's environment.
func ProcessSettings() map[string]string { return Settings(os.Environ()) }

// SortedKeys lists a settings map's keys in order, for stable output.
func SortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
