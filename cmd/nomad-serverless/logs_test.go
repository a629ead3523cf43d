package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestLogsArguments(t *testing.T) {
	var stderr bytes.Buffer
	e := &env{stdout: &bytes.Buffer{}, stderr: &stderr, getenv: func(string) string { return "" }}
	if code := runLogs(context.Background(), e, []string{"-since", "48h", "hello"}); code != exitUsage || !strings.Contains(stderr.String(), "use 0 to 24h0m0s") {
		t.Errorf("-since 48h: exit %d: %s", code, stderr.String())
	}
	stderr.Reset()
	if code := runLogs(context.Background(), e, []string{}); code != exitUsage || !strings.Contains(stderr.String(), "Usage: nomad-serverless logs") {
		t.Errorf("no service: exit %d: %s", code, stderr.String())
	}
	stderr.Reset()
	if code := runLogs(context.Background(), e, []string{"-sidecar", "-task", "migrate", "hello"}); code != exitUsage || !strings.Contains(stderr.String(), "give one") {
		t.Errorf("-sidecar -task: exit %d: %s", code, stderr.String())
	}
}
