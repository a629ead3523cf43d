//go:build !linux

package h2relay

import "time"

// eploop is Linux's (eploop_linux.go); elsewhere every socket has a
// reader goroutine.
type eploop struct{}

type esock struct {
	ended bool
	done  chan struct{}
	rest  []byte
}

func newEploop(*group) *eploop { return nil }

func (l *eploop) add(*side, []byte, *Config) (*esock, bool) { return nil, false }
func (l *eploop) steps(*esock, []byte, bool, time.Time)     {}
func (es *esock) shutdown()                                 {}
func (es *esock) tryWrite(p []byte) (int, error)            { return 0, nil }
