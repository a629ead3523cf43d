package consulroute

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestRegisterActivatorWritesDefaultsThenRegistersWithCheck(t *testing.T) {
	missing := notFoundEntry("service-defaults", spec.ActivatorServiceName)
	defaults := fx(t, "030-config-service-defaults-nomad-serverless-activator.json")
	register := fx(t, "026-agent-service-register-activator.json")
	register.Request.Query.Set("replace-existing-checks", "true")
	c, replay := replayClient(t, missing, defaults, register)

	err := c.RegisterActivator(ctxTimeout(t, 5*time.Second), ActivatorRegistration{Address: "127.0.0.1", Port: 8080, AdminPort: 9091})
	if err != nil {
		t.Fatal(err)
	}
	got := replay.Received()
	if len(got) != 3 {
		t.Fatalf("sent %d requests, want 3", len(got))
	}
	assertSent(t, got[0], missing)
	assertSent(t, got[1], defaults)
	// The recording registered with a stand-in check on Nomad; ours checks
	// the activator's own admin /healthz and names the replica.
	assertSent(t, got[2], register, map[string]any{
		"Name": "nomad-serverless-activator", "ID": "nomad-serverless-activator-r1",
		"Port": 8080, "Address": "127.0.0.1", "Tags": []string{"serverless"},
		"Meta": map[string]string{"admin-port": "9091", "replica": "r1"},
		"Check": map[string]any{
			"Name": "activator healthz", "HTTP": "http://127.0.0.1:9091/healthz",
			"Interval": "2s", "Timeout": "1s", "Status": "passing", "DeregisterCriticalServiceAfter": "1m0s",
		},
	})
}

func TestRegisterActivatorKeepsExistingHTTPDefaults(t *testing.T) {
	existing := synthetic("activator defaults exist", "GET", "/v1/config/service-defaults/"+spec.ActivatorServiceName, nil, 200, "30",
		map[string]any{"Kind": "service-defaults", "Name": spec.ActivatorServiceName, "Protocol": "http", "CreateIndex": 30, "ModifyIndex": 30})
	register := fx(t, "026-agent-service-register-activator.json")
	register.Request.Query.Set("replace-existing-checks", "true")
	c, replay := replayClient(t, existing, register)
	if err := c.RegisterActivator(ctxTimeout(t, 5*time.Second), ActivatorRegistration{ID: "act-a", Address: "10.0.0.5", Port: 80, AdminPort: 81}); err != nil {
		t.Fatal(err)
	}
	got := replay.Received()
	if len(got) != 2 || got[1].Path != "/v1/agent/service/register" {
		t.Fatalf("requests %+v, want the read then the registration only", got)
	}
	var body struct{ ID string }
	got[1].JSON(t, &body)
	if body.ID != "act-a" {
		t.Errorf("registered ID %q, want the one given", body.ID)
	}
}

func TestRegisterActivatorValidates(t *testing.T) {
	c, replay := replayClient(t)
	ctx := ctxTimeout(t, time.Second)
	for _, reg := range []ActivatorRegistration{
		{Port: 1, AdminPort: 2},
		{Address: "a", Port: 0, AdminPort: 2},
		{Address: "a", Port: 1, AdminPort: 70000},
	} {
		if err := c.RegisterActivator(ctx, reg); err == nil {
			t.Errorf("accepted %+v", reg)
		}
	}
	if len(replay.Received()) != 0 {
		t.Error("an invalid registration reached Consul")
	}
}

// A stand-in is a catalog registration on a node of the replica's own,
// with a check that passes from the start; deregistering it names the node
// and the service, and Consul answers true for an absent one as well
// (Consul 1.22.7's answers, checked against a dev agent).
func TestStandInRegistersTaggedActivatorAndDeregisters(t *testing.T) {
	register := synthetic("catalog register stand-in", "PUT", "/v1/catalog/register", nil, 200, "", true)
	deregister := synthetic("catalog deregister stand-in", "PUT", "/v1/catalog/deregister", nil, 200, "", true)
	again := synthetic("catalog deregister again", "PUT", "/v1/catalog/deregister", nil, 200, "", true)
	c, replay := replayClient(t, register, deregister, again)
	ctx := ctxTimeout(t, 5*time.Second)

	if err := c.RegisterStandIn(ctx, "hello-00001", "hello", "127.0.0.1", 8080); err != nil {
		t.Fatal(err)
	}
	if err := c.DeregisterStandIn(ctx, "hello-00001"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeregisterStandIn(ctx, "hello-00001"); err != nil {
		t.Errorf("deregistering an absent stand-in: %v, want nil", err)
	}
	node := c.StandInNode("hello-00001")
	if !strings.HasPrefix(node, "nomad-serverless-stand-ins-r1-") {
		t.Fatalf("StandInNode = %q, want one of r1's", node)
	}
	got := replay.Received()
	// Passing from the start, never run by anybody: Fabio routes only to
	// instances with a passing check of their own (issue 45: an alias
	// check on the agent cost it a copy of every check it holds).
	assertSent(t, got[0], register, api.CatalogRegistration{
		Node: node, Address: "127.0.0.1",
		NodeMeta:       map[string]string{"nomad-serverless-stand-ins": "true", "replica": "r1"},
		SkipNodeUpdate: true,
		Service: &api.AgentService{
			ID: "hello-00001-activator-r1", Service: "hello-00001",
			Tags: []string{"serverless", "service=hello", "activator"},
			Port: 8080, Address: "127.0.0.1",
			Meta: map[string]string{"service": "hello", "revision": "hello-00001", "replica": "r1"},
		},
		Check: &api.AgentCheck{
			Node: node, CheckID: "nomad-serverless-stand-in:hello-00001-activator-r1",
			Name: "nomad-serverless activator stand-in", Status: "passing",
			Output:    "the activator of control-plane replica r1 takes this revision's requests while it has no ready instance",
			ServiceID: "hello-00001-activator-r1", ServiceName: "hello-00001",
		},
	})
	assertSent(t, got[1], deregister, map[string]any{"Node": node, "ServiceID": "hello-00001-activator-r1"})

	if err := c.RegisterStandIn(ctx, "hello-00001", "other", "127.0.0.1", 8080); err == nil {
		t.Error("RegisterStandIn accepted a revision of another service")
	}
}

// ActivatorRegistered asks the local agent for this replica's own
// registration by ID and reads Consul 1.16's answers: the service (061)
// is "held", the 404 with text (062) is "lost", not an error.
func TestActivatorRegisteredReplay(t *testing.T) {
	held := fx(t, "061-agent-service-activator.json")
	c, replay := replayClient(t, withPath(held, "/v1/agent/service/nomad-serverless-activator-r1"))
	if ok, err := c.ActivatorRegistered(ctxTimeout(t, 5*time.Second), ""); err != nil || !ok {
		t.Errorf("held: ActivatorRegistered = %v, %v; want true, nil", ok, err)
	}
	assertSent(t, replay.Received()[0], withPath(held, "/v1/agent/service/nomad-serverless-activator-r1"))

	lost := fx(t, "062-agent-service-unknown.json")
	c, replay = replayClient(t, withPath(lost, "/v1/agent/service/nomad-serverless-activator-r1"))
	if ok, err := c.ActivatorRegistered(ctxTimeout(t, 5*time.Second), ""); err != nil || ok {
		t.Errorf("lost: ActivatorRegistered = %v, %v; want false, nil", ok, err)
	}
	assertSent(t, replay.Received()[0], withPath(lost, "/v1/agent/service/nomad-serverless-activator-r1"))
}
