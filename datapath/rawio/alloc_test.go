//go:build linux && !race

package rawio

import (
	"io"
	"testing"
	"time"
)

// The hot path allocates nothing: the attempt functions are bound once.
func TestReadWriteAllocateNothing(t *testing.T) {
	client, server := pair(t)
	c, s := New(client), New(server)
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	msg, buf := []byte("ping"), make([]byte, 4)
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("a Write and a Read allocate %.1f times; want 0", allocs)
	}
}
