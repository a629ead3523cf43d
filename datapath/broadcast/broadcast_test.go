package broadcast

import (
	"testing"
	"time"
)

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestSignal(t *testing.T) {
	var s Signal
	s.Notify() // nobody waits: nothing to close, no panic
	a, b := s.Changed(), s.Changed()
	if a != b || closed(a) {
		t.Fatal("two waiters before a change: want one open channel")
	}
	s.Notify()
	if !closed(a) {
		t.Fatal("Notify left the waiters' channel open")
	}
	c := s.Changed()
	if closed(c) {
		t.Fatal("a channel taken after the change is already closed")
	}
	done := make(chan struct{})
	go func() { <-c; close(done) }()
	s.Notify()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a goroutine waiting on Changed was not woken")
	}
}
