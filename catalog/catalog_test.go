package catalog

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// changed reports whether ch is closed. Setters close it before they
// return, so no waiting is needed.
func changed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestChangedFiresOnEveryKindOfChange(t *testing.T) {
	c := New()
	steps := []struct {
		name string
		do   func()
	}{
		{"set revision", func() { c.SetRevision(Revision{Name: "hello-00001", Service: "hello"}) }},
		{"set allocation", func() { c.SetAllocation(Allocation{ID: "a1", Revision: "hello-00001", Running: true}) }},
		{"set ready", func() {
			c.SetReady("hello-00001", []consulroute.Instance{{ID: "i1", Revision: "hello-00001", Address: "127.0.0.1", Port: 1}})
		}},
		{"set service", func() { c.SetService(Service{Name: "hello"}) }},
		{"delete allocation", func() { c.DeleteAllocation("a1") }},
		{"delete service", func() { c.DeleteService("hello") }},
		{"delete revision", func() { c.DeleteRevision("hello-00001") }},
	}
	for _, s := range steps {
		ch := c.Changed()
		s.do()
		if !changed(ch) {
			t.Fatalf("%s: Changed did not fire", s.name)
		}
	}
}

func TestNoChangeNoNotification(t *testing.T) {
	c := New()
	a := Allocation{ID: "a1", Revision: "r", Running: true}
	inst := []consulroute.Instance{{ID: "i1", Revision: "r"}}
	// A revision and a service set again as they are (issue 45: the
	// records feed sets every service on each change of any).
	rev := Revision{Name: "r", Service: "s", Scaling: spec.Scaling{Min: 1, Max: 3}}
	svc := Service{Name: "s", Domains: []string{"a.example"}, Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "r", Percent: 100}}}}
	c.SetAllocation(a)
	c.SetReady("r", inst)
	c.SetRevision(rev)
	c.SetService(svc)
	ch := c.Changed()
	c.SetAllocation(a)
	c.SetReady("r", inst)
	c.SetRevision(rev)
	c.SetService(Service{Name: "s", Domains: []string{"a.example"}, Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "r", Percent: 100}}}})
	c.DeleteAllocation("nope")
	if changed(ch) {
		t.Fatal("Changed fired although nothing changed")
	}
}

func TestDeleteRevisionForgetsItsAllocationsAndInstances(t *testing.T) {
	c := New()
	c.SetRevision(Revision{Name: "r1"})
	c.SetRevision(Revision{Name: "r2"})
	c.SetAllocation(Allocation{ID: "a1", Revision: "r1"})
	c.SetAllocation(Allocation{ID: "a2", Revision: "r2"})
	c.SetReady("r1", []consulroute.Instance{{ID: "i1", Revision: "r1"}})
	c.DeleteRevision("r1")
	if _, ok := c.Revision("r1"); ok {
		t.Error("r1 still known")
	}
	if got := c.Allocations("r1"); len(got) != 0 {
		t.Errorf("allocations of r1 = %v", got)
	}
	if got := c.Ready("r1"); len(got) != 0 {
		t.Errorf("ready of r1 = %v", got)
	}
	if got := c.Allocations("r2"); len(got) != 1 {
		t.Errorf("allocations of r2 = %v, want a2 kept", got)
	}
}

func TestReadersGetCopies(t *testing.T) {
	c := New()
	c.SetReady("r", []consulroute.Instance{{ID: "i1"}})
	got := c.Ready("r")
	got[0].ID = "changed"
	if c.Ready("r")[0].ID != "i1" {
		t.Fatal("Ready returned the catalog's own slice")
	}
	c.SetRevision(Revision{Name: "b"})
	c.SetRevision(Revision{Name: "a"})
	revs := c.Revisions()
	if len(revs) != 2 || revs[0].Name != "a" || revs[1].Name != "b" {
		t.Fatalf("Revisions not sorted: %v", revs)
	}
}

func TestAllocationsOfOneRevisionSorted(t *testing.T) {
	c := New()
	c.SetAllocation(Allocation{ID: "b", Revision: "r1"})
	c.SetAllocation(Allocation{ID: "a", Revision: "r1"})
	c.SetAllocation(Allocation{ID: "c", Revision: "r2"})
	if got := c.Allocations("r1"); len(got) != 2 || got[0].ID != "a" || got[1].ID != "b" {
		t.Fatalf("allocations of r1 = %v, want a and b in order", got)
	}
	// An ID seen again under another revision moves there.
	c.SetAllocation(Allocation{ID: "b", Revision: "r2"})
	if got := c.Allocations("r1"); len(got) != 1 || got[0].ID != "a" {
		t.Errorf("allocations of r1 after b moved = %v, want a", got)
	}
	if got := c.Allocations("r2"); len(got) != 2 || got[0].ID != "b" || got[1].ID != "c" {
		t.Errorf("allocations of r2 after b moved = %v, want b and c", got)
	}
	c.DeleteAllocation("b")
	c.DeleteAllocation("c")
	if got := c.Allocations("r2"); len(got) != 0 {
		t.Errorf("allocations of r2 after deleting both = %v", got)
	}
	// A deleted allocation's ID is free again: setting it notifies.
	ch := c.Changed()
	c.SetAllocation(Allocation{ID: "c", Revision: "r2"})
	if !changed(ch) {
		t.Error("setting a deleted allocation again did not fire Changed")
	}
}
