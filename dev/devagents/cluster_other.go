//go:build !linux

package devagents

import "time"

// processTree needs /proc; a dev cluster runs on Linux only (HoldLoopback
// refuses elsewhere), so these are never reached with anything to do.
type processTree []struct{}

func snapshotTree(pid int) processTree { return nil }

func (t processTree) kill() int { return 0 }

func (t processTree) waitGone(timeout time.Duration) {}

func unmountBelow(dir string) ([]string, error) { return nil, nil }
