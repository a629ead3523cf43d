//go:build !linux

package devagents

// Guarded runs body without a guard: the guard needs Linux (a child
// subreaper, /proc). See guard_linux.go.
func Guarded(o GuardOptions, body func(*Guard) int) int {
	_ = o.withDefaults()
	return body(nil)
}

// DescribeDescendants needs /proc: nil here.
func DescribeDescendants(pid int) []string { return nil }
