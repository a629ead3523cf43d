package rawh2

import (
	"fmt"
	"testing"

	"golang.org/x/net/http2"
)

// RapidResets is how many streams the rapid-reset case opens and cancels.
const RapidResets = 10000

// RapidResetReach bounds by default the cancelled streams of the
// rapid-reset case that may reach the instance (Target.RapidResetReach).
const RapidResetReach = 1000

// resetCases are the stream-count attacks: rapid reset and streams beyond
// SETTINGS_MAX_CONCURRENT_STREAMS.
func resetCases() []Case {
	// The stream after the rapid resets, which is answered when the
	// server kept the connection.
	const after = 2*RapidResets + 1
	return []Case{
		{
			Name: fmt.Sprintf("rapid reset: %d streams opened and at once cancelled (CVE-2023-44487; §5.4.2, §10.5: ENHANCE_YOUR_CALM): GOAWAY ENHANCE_YOUR_CALM or closed, or every stream gone and the next answered; what reaches the instance within the target's bound, bounded memory", RapidResets),
			Send: func(t testing.TB, c *Conn, tg *Target) {
				_ = c.Frames(func(fr *http2.Framer) error {
					for i := range RapidResets {
						id := uint32(2*i + 1)
						block := c.RequestBlock("GET", tg.Host, tg.Path)
						if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
							return err
						}
						if err := fr.WriteRSTStream(id, http2.ErrCodeCancel); err != nil {
							return err
						}
					}
					return nil
				})
				_ = c.Request(after, "GET", tg.Host, tg.Path, true)
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Ended[after] },
			Want: func(o *Outcome) error {
				if o.Ended[after] && o.Statuses[after] == "200" {
					return nil
				}
				return goAway(true, http2.ErrCodeEnhanceYourCalm)(o)
			},
			// A stream's HEADERS may be passed on before its RST_STREAM
			// is read (the instance then gets a reset too); what the
			// attack must not get is every stream passed on.
			AtInstanceFn: func(tg *Target) int64 {
				if tg.RapidResetReach > 0 {
					return tg.RapidResetReach + 1
				}
				return RapidResetReach + 1
			},
		},
		{
			Name: "streams beyond SETTINGS_MAX_CONCURRENT_STREAMS (§5.1.2: a stream error PROTOCOL_ERROR or REFUSED_STREAM): the extra streams reset, the held ones answered once released, the connection kept",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				for i := range tg.MaxStreams {
					must(t, c.Request(uint32(2*i+1), "GET", tg.Host, tg.Hold(i), true))
				}
				// Every held stream answered its head: they are all
				// open at the server (the count does not race the
				// handlers).
				if o, ok := c.Wait(Within, func(o *Outcome) bool { return len(o.Statuses) >= tg.MaxStreams }); !ok || o.Over() {
					t.Fatalf("the held streams: %s", &o)
				}
				for i := range 10 {
					must(t, c.Request(uint32(2*(tg.MaxStreams+i)+1), "GET", tg.Host, tg.Path, true))
				}
			},
			Done: func(o *Outcome) bool { return o.Over() || len(o.Resets) >= 10 },
			Want: func(o *Outcome) error {
				if o.Over() {
					return fmt.Errorf("the connection ended; want stream errors only")
				}
				for id, code := range o.Resets {
					if code != http2.ErrCodeProtocol && code != http2.ErrCodeRefusedStream {
						return fmt.Errorf("stream %d reset %v, want PROTOCOL_ERROR or REFUSED_STREAM", id, code)
					}
				}
				return nil
			},
			AtInstanceFn: func(tg *Target) int64 { return int64(tg.MaxStreams) },
			After: func(t testing.TB, c *Conn, tg *Target, o *Outcome) {
				for i := range tg.MaxStreams {
					if _, reset := o.Resets[uint32(2*i+1)]; reset {
						t.Errorf("held stream %d was reset", 2*i+1)
					}
				}
				for i := range 10 {
					if _, reset := o.Resets[uint32(2*(tg.MaxStreams+i)+1)]; !reset {
						t.Errorf("stream %d, beyond the limit, was not reset", 2*(tg.MaxStreams+i)+1)
					}
				}
				tg.Release(t, tg.MaxStreams)
				all, ok := c.Wait(Within, func(o *Outcome) bool { return len(o.Ended) >= tg.MaxStreams })
				if !ok || len(all.Ended) < tg.MaxStreams {
					t.Errorf("after the release: %s; want the %d held streams ended", &all, tg.MaxStreams)
				}
			},
		},
	}
}
