package consulroute

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func TestNewClientValidatesOptions(t *testing.T) {
	for name, o := range map[string]Option{
		"empty replica":     WithReplica(""),
		"nil logger":        WithLogger(nil),
		"zero wait":         WithWaitTime(0),
		"wait over 10m":     WithWaitTime(11 * time.Minute),
		"backoff min > max": WithBackoff(time.Second, time.Millisecond),
	} {
		if _, err := NewClient(&api.Config{Address: "127.0.0.1:1"}, o); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c, err := NewClient(&api.Config{Address: "127.0.0.1:8501", Scheme: "https"}, WithReplica("x"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Addr() != "https://127.0.0.1:8501" || c.Replica() != "x" || c.API() == nil {
		t.Errorf("addr %q replica %q", c.Addr(), c.Replica())
	}
}

func TestBackoffDoublesUpToMax(t *testing.T) {
	c := testClient(t, "127.0.0.1:1", WithBackoff(100*time.Millisecond, time.Second))
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := c.backoff(i); got != w*time.Millisecond {
			t.Errorf("backoff(%d) = %s, want %s", i, got, w*time.Millisecond)
		}
	}
}

func TestRecordsSkipsUnreadableKeys(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	ctx := ctxTimeout(t, 5*time.Second)
	if err := c.Publish(ctx, recordWith(nil, "hello-00001", []string{"hello-00001"}, nil), 0); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.putKV(KVPrefix+"default/broken", nil, []byte("{not json"))
	f.putKV(KVPrefix+"default/liar", nil, []byte(`{"service":{"name":"someone-else"}}`))
	f.putKV(KVPrefix+"too/deep/key", nil, []byte(`{}`))
	f.mu.Unlock()
	recs, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Service.Name != "hello" {
		t.Errorf("records %+v, want only hello", recs)
	}
}

func TestActivatorRegistrationRoundTripOnFake(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr, WithReplica("r9"))
	ctx := context.Background()
	if err := c.RegisterActivator(ctx, ActivatorRegistration{Address: "127.0.0.1", Port: 8080, AdminPort: 9090, Domain: "example.com"}); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	meta, _ := f.services["nomad-serverless-activator-r9"]["Meta"].(map[string]any)
	f.mu.Unlock()
	if meta["domain"] != "example.com" || meta["admin-port"] != "9090" || meta["replica"] != "r9" {
		t.Errorf("activator meta %v", meta)
	}
	// A second replica start does not rewrite the shared defaults.
	f.resetWriteLog()
	if err := c.RegisterActivator(ctx, ActivatorRegistration{Address: "127.0.0.1", Port: 8080, AdminPort: 9090}); err != nil {
		t.Fatal(err)
	}
	if w := f.writeLog(); len(w) != 1 || w[0] != "PUT register nomad-serverless-activator-r9" {
		t.Errorf("re-registration wrote %v", w)
	}
	if err := c.DeregisterActivator(ctx, ""); err != nil {
		t.Fatal(err)
	}
	if err := c.DeregisterActivator(ctx, ""); err != nil {
		t.Errorf("deregistering twice: %v", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.services) != 0 {
		t.Errorf("services left: %v", f.services)
	}
}
