package consulroute

import (
	"maps"
	"testing"
	"time"
)

// What serve publishes deploy reads back; nothing published reads as no
// settings, not as an error.
func TestTracingSettingsRoundTrip(t *testing.T) {
	_, addr := newFakeConsul(t)
	c := testClient(t, addr)
	ctx := ctxTimeout(t, 20*time.Second)
	got, err := c.TracingSettings(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("nothing published: %v, %v", got, err)
	}
	want := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio"}
	if err := c.PutTracingSettings(ctx, want); err != nil {
		t.Fatal(err)
	}
	if got, err = c.TracingSettings(ctx); err != nil || !maps.Equal(got, want) {
		t.Fatalf("read back %v, %v; want %v", got, err, want)
	}
	if err := c.PutTracingSettings(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if got, err = c.TracingSettings(ctx); err != nil || len(got) != 0 {
		t.Fatalf("tracing switched off: read %v, %v", got, err)
	}
}
