//go:build linux && !race

package rawio

import (
	"testing"
	"time"
)

// What AwaitReply is for: the read after a request's write finds the reply
// at its first attempt, instead of failing with EAGAIN and trying again.
// Without it the same exchanges take about two reads each (the reply comes
// a millisecond after the request), which shows the count can tell.
func TestAwaitReplySavesTheFailedRead(t *testing.T) {
	const exchanges = 40
	reads := func(await bool) int {
		client, server := pair(t)
		go echo(server, time.Millisecond)
		client.SetReadDeadline(time.Now().Add(20 * time.Second))
		c := New(client)
		buf := make([]byte, 8)
		for range exchanges {
			if await {
				c.AwaitReply()
			}
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Read(buf); err != nil || string(buf[:n]) != "ping" {
				t.Fatalf("Read = %q, %v; want \"ping\"", buf[:n], err)
			}
		}
		return c.readCalls
	}
	without, with := reads(false), reads(true)
	if with > exchanges+exchanges/10 {
		t.Errorf("%d exchanges made %d read calls with AwaitReply; want about one each", exchanges, with)
	}
	if without < exchanges+exchanges/2 {
		t.Errorf("%d exchanges made %d read calls without AwaitReply; want about two each (else this test cannot tell)", exchanges, without)
	}
	t.Logf("read calls for %d exchanges: %d without AwaitReply, %d with", exchanges, without, with)
}
