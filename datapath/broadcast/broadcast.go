// Package broadcast wakes every goroutine waiting for the next change of
// some state, however many there are, without a goroutine of its own.
package broadcast

import "sync"

// Signal hands out a channel that Notify closes. A waiter takes the channel
// (Changed) before it reads the state it waits on: a change made between
// the two then closes the channel it holds, so no change is missed. The
// zero value is ready to use; a Signal must not be copied after first use.
type Signal struct {
	mu sync.Mutex
	ch chan struct{} // nil until someone waits
}

// Changed returns a channel closed at the next Notify.
func (s *Signal) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch == nil {
		s.ch = make(chan struct{})
	}
	return s.ch
}

// Notify wakes everyone who took a channel since the last Notify. With no
// one waiting it costs a lock and nothing else.
func (s *Signal) Notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ch != nil {
		close(s.ch)
		s.ch = nil
	}
}
