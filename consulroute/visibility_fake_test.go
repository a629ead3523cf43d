package consulroute

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// failoverOf is the service a revision's resolver in the fake fails over
// to.
func failoverOf(t *testing.T, f *fakeConsul, rev string) string {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.entry("service-resolver", rev)
	if e == nil {
		t.Fatalf("no resolver for %s", rev)
	}
	fo, _ := e.body["Failover"].(map[string]any)
	star, _ := fo["*"].(map[string]any)
	targets, _ := star["Targets"].([]any)
	if len(targets) != 1 {
		t.Fatalf("resolver %s fails over to %v, want one target", rev, targets)
	}
	svc, _ := targets[0].(map[string]any)["Service"].(string)
	return svc
}

// An internal service's visibility goes to Consul with its record (read
// back as written), its revisions fail over in the mesh to the gateways'
// internal listeners, and turning it public changes only its resolvers and
// its record: no new revision, no other entry.
func TestPublishVisibilityRoundTripAndFailover(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	ctx := ctxTimeout(t, 20*time.Second)
	f.afterWrite = noDanglingRoutes(t, "hello")

	internal := recordWith(nil, "hello-00001", []string{"hello-00001"}, nil)
	internal.Service.Visibility = spec.VisibilityInternal
	publish(t, c, internal)
	rec, _, err := c.ReadRecord(ctx, "", "hello")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.Service.Internal() || !reflect.DeepEqual(rec.Service, internal.Service) {
		t.Fatalf("record read back: %+v, want %+v", rec.Service, internal.Service)
	}
	if got := failoverOf(t, f, "hello-00001"); got != spec.InternalServiceName {
		t.Errorf("an internal revision fails over to %s, want %s", got, spec.InternalServiceName)
	}
	if p := f.protocol(spec.InternalServiceName); p != "http" {
		t.Errorf("service-defaults %s protocol %q, want http (Consul fails over only between matching protocols)", spec.InternalServiceName, p)
	}

	public := internal
	public.Service.Visibility = spec.VisibilityPublic
	f.resetWriteLog()
	publish(t, c, public)
	want := []string{
		"PUT config service-resolver hello-00001",
		"PUT kv nomad-serverless/services/default/hello",
	}
	if w := f.writeLog(); !reflect.DeepEqual(w, want) {
		t.Errorf("writes for a visibility change:\n got  %v\n want %v", w, want)
	}
	if got := failoverOf(t, f, "hello-00001"); got != spec.ActivatorServiceName {
		t.Errorf("a public revision fails over to %s, want %s", got, spec.ActivatorServiceName)
	}
}

// A replica with an internal listener registers it as an instance of
// spec.InternalServiceName whose check mirrors the activator's, names it in
// the activator's meta, and removes it with the activator.
func TestRegisterActivatorWithInternalListener(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr, WithReplica("r1"))
	ctx := ctxTimeout(t, 10*time.Second)
	err := c.RegisterActivator(ctx, ActivatorRegistration{Address: "10.0.0.5", Port: 8080, AdminPort: 8081,
		InternalAddress: "10.1.0.5", InternalPort: 8082, Domain: "example.com"})
	if err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	act := f.services["nomad-serverless-activator-r1"]
	in := f.services["nomad-serverless-internal-r1"]
	f.mu.Unlock()
	if meta, _ := act["Meta"].(map[string]any); meta[MetaInternal] != "10.1.0.5:8082" {
		t.Errorf("activator meta %v, want %s=10.1.0.5:8082", act["Meta"], MetaInternal)
	}
	if in == nil {
		t.Fatalf("no registration of the internal listener; have %v", f.services)
	}
	check, _ := in["Check"].(map[string]any)
	if in["Name"] != spec.InternalServiceName || in["Address"] != "10.1.0.5" || in["Port"] != 8082.0 ||
		check["AliasService"] != "nomad-serverless-activator-r1" {
		t.Errorf("internal listener registered as %v", in)
	}
	if p := f.protocol(spec.InternalServiceName); p != "http" {
		t.Errorf("service-defaults %s protocol %q, want http", spec.InternalServiceName, p)
	}
	if err := c.DeregisterActivator(ctx, ""); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	left := len(f.services)
	f.mu.Unlock()
	if left != 0 {
		t.Errorf("%d registrations left after DeregisterActivator", left)
	}
}
