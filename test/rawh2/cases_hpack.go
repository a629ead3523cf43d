package rawh2

import (
	"fmt"
	"strings"
	"testing"

	"golang.org/x/net/http2"
)

// HPACK blocks are built by hand here (not with the connection's
// encoder, whose idea of the dynamic table they would upset): static
// table entries for :method GET (2) and :scheme http (6), literal
// :authority and :path.
func requestPrefix(tg *Target) []byte {
	b := append(indexed(2), indexed(6)...)
	b = append(b, literalName(1, tg.Host)...) // :authority
	return append(b, literalName(4, tg.Path)...)
}

// literalName is a literal header field without indexing whose name is
// static table entry i (RFC 7541 §6.2.2).
func literalName(i uint64, value string) []byte {
	b := appendInt(nil, 4, i)
	b = appendInt(b, 7, uint64(len(value)))
	return append(b, value...)
}

// compression wants the connection error COMPRESSION_ERROR (RFC 9113
// §4.3: a field block that cannot be decoded).
var compression = goAway(true, http2.ErrCodeCompression)

// hpackCases are HPACK bombs and decoding errors (RFC 7541; RFC 9113
// §4.3, §10.5.1).
func hpackCases() []Case {
	return []Case{
		{
			Name: "header list twice the server's limit in 1 KiB fields (§10.5.1: 431, or a connection error): 431, RST_STREAM, GOAWAY or closed; nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := requestPrefix(tg)
				field := literal("x-big", strings.Repeat("b", 1000))
				for range 2 * tg.MaxHeaderBytes / len(field) {
					block = append(block, field...)
				}
				_ = headers(c, 1, block, true)
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Answered(1) },
			Want: overLimit,
		},
		{
			Name: "HPACK bomb: a 4 KiB field indexed once, then referenced 60000 times (240 MB decoded from 64 KB; §10.5.1): 431, RST_STREAM, GOAWAY or closed; nothing passed on, bounded memory",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := append(requestPrefix(tg), indexedLiteral("x-bomb", strings.Repeat("B", 4000))...)
				for range 60000 {
					block = append(block, indexed(62)...)
				}
				_ = headers(c, 1, block, true)
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Answered(1) },
			Want: overLimit,
		},
		{
			Name: "dynamic table churn: 200 streams each inserting a 4 KiB field that evicts the last one (RFC 7541 §4.4; legal): all 200 answered 200, bounded memory",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Frames(func(fr *http2.Framer) error {
					for i := range 200 {
						block := append(requestPrefix(tg), indexedLiteral("x-churn", fmt.Sprintf("%04d", i)+strings.Repeat("c", 3996))...)
						block = append(block, indexed(62)...) // and used once, as x-churn twice
						if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: block, EndHeaders: true, EndStream: true}); err != nil {
							return err
						}
					}
					return nil
				}))
			},
			Done: func(o *Outcome) bool { return o.Over() || len(o.Ended) >= 200 },
			Want: func(o *Outcome) error {
				for i := range 200 {
					if s := o.Statuses[uint32(2*i+1)]; s != "200" || !o.Ended[uint32(2*i+1)] {
						return fmt.Errorf("stream %d: %q, want 200", 2*i+1, s)
					}
				}
				return nil
			},
			AtInstance: 200,
		},
		{
			Name: "indexed field beyond the table: index 62 with an empty dynamic table (RFC 7541 §2.3.3: a decoding error; §4.3: COMPRESSION_ERROR): GOAWAY COMPRESSION_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				_ = headers(c, 1, append(requestPrefix(tg), indexed(62)...), true)
			},
			Want: compression,
		},
		{
			Name: "indexed field 0 (RFC 7541 §6.1: a decoding error; §4.3: COMPRESSION_ERROR): GOAWAY COMPRESSION_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				_ = headers(c, 1, append(requestPrefix(tg), indexed(0)...), true)
			},
			Want: compression,
		},
		{
			Name: "dynamic table size update to 1 MiB, over SETTINGS_HEADER_TABLE_SIZE (RFC 7541 §6.3, §4.2: a decoding error; §4.3: COMPRESSION_ERROR): GOAWAY COMPRESSION_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				_ = headers(c, 1, append(tableSizeUpdate(1<<20), requestPrefix(tg)...), true)
			},
			Want: compression,
		},
		{
			Name: "string literal declaring 2 GiB (RFC 7541 §5.2; §10.5.1): COMPRESSION_ERROR or over the limit (431, RST_STREAM, GOAWAY, closed) without reading it; nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := append(requestPrefix(tg), 0x00)
				block = appendInt(block, 7, 1<<31)
				_ = headers(c, 1, append(block, "x-huge"...), true)
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Answered(1) },
			Want: overLimit,
		},
	}
}

// overLimit takes what RFC 9113 §10.5.1 allows for a field block over the
// server's limit: 431 on the stream, a stream or connection error, a close.
func overLimit(o *Outcome) error {
	if _, reset := o.Resets[1]; reset || o.Statuses[1] == "431" {
		return nil
	}
	if len(o.Statuses) > 0 {
		return fmt.Errorf("stream 1 answered %s, want 431 or an error", o.Statuses[1])
	}
	return goAway(true, http2.ErrCodeProtocol, http2.ErrCodeCompression, http2.ErrCodeEnhanceYourCalm, http2.ErrCodeFrameSize)(o)
}
