package consulroute

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// TracingKey holds the control plane's tracing settings (the OTEL_*
// variables serve runs with, OTEL_SERVICE_NAME left out) as a JSON object.
// serve writes it when it starts; deploy reads it and compiles the
// settings into every new revision's queue-proxy task, so the sidecars
// export to the same collector with the same sampler. It holds no secret
// a deployer may not see (an OTLP header with a token would be one: such
// a collector should take the token from the node, not from here), so
// it is outside ControlPlaneKVPrefix and the deploy policy reads it.
const TracingKey = "nomad-serverless/tracing"

// PutTracingSettings publishes serve's tracing settings (empty: tracing
// off, and sidecars of new revisions trace nothing).
func (c *Client) PutTracingSettings(ctx context.Context, settings map[string]string) error {
	if settings == nil {
		settings = map[string]string{}
	}
	b, err := json.Marshal(settings)
	if err != nil {
		return fmt.Errorf("encoding the tracing settings: %w", err)
	}
	return c.KVPut(ctx, TracingKey, b)
}

// TracingSettings reads what serve published; none published is an
// empty map, not an error.
func (c *Client) TracingSettings(ctx context.Context) (map[string]string, error) {
	e, err := c.KVGet(ctx, TracingKey)
	if errors.Is(err, ErrNotFound) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	if err := json.Unmarshal(e.Value, &out); err != nil {
		return nil, fmt.Errorf("reading %s: %w", TracingKey, err)
	}
	return out, nil
}
