package h2relay

import (
	"bytes"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// A turn's frames leave in one write, in order; header blocks larger than
// the peer's frame size are split into CONTINUATION frames and read back
// whole; deliveries are handed back untouched.
func TestWriterCoalescesFrames(t *testing.T) {
	p := started(t, Config{})
	acts := p.send(p.headers(1, true, get...))
	w, err := NewWriter(16 << 10)
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("v", 40<<10)
	p.c.SendHeaders(p.now, 1, []hpack.HeaderField{{Name: ":status", Value: "200"}, {Name: "x-big", Value: big}}, false, false)
	p.c.SendData(p.now, 1, []byte("body"), false)
	p.c.SendHeaders(p.now, 1, []hpack.HeaderField{{Name: "grpc-status", Value: "0"}}, true, false)
	acts = append(acts, p.c.Actions()...)
	rest, err := w.Apply(acts, nil)
	if err != nil {
		t.Fatal(err)
	}
	if describe(rest) != "headers(1,end=true)" {
		t.Fatalf("deliveries: %s", describe(rest))
	}
	var sink countingWriter
	if err := w.Flush(&sink); err != nil || sink.writes != 1 || w.Buffered() != 0 {
		t.Fatalf("flush: %v, %d writes", err, sink.writes)
	}
	fr := http2.NewFramer(nil, bytes.NewReader(sink.b.Bytes()))
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = 1 << 20
	var got []string
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			break
		}
		switch f := f.(type) {
		case *http2.MetaHeadersFrame:
			v := f.Fields[len(f.Fields)-1]
			got = append(got, "H:"+v.Name+":"+strings.TrimRight(v.Value[:min(1, len(v.Value))], "")+":"+map[bool]string{true: "end", false: ""}[f.StreamEnded()])
			if v.Name == "x-big" && v.Value != big {
				t.Fatal("the big header did not survive")
			}
		case *http2.DataFrame:
			got = append(got, "D:"+string(f.Data()))
		}
	}
	want := "H:x-big:v: D:body H:grpc-status:0:end"
	if strings.Join(got, " ") != want {
		t.Fatalf("frames %q, want %q", strings.Join(got, " "), want)
	}
	if _, err := NewWriter(100); err == nil {
		t.Fatal("a frame size below 2^14 accepted")
	}
}

type countingWriter struct {
	b      bytes.Buffer
	writes int
}

func (c *countingWriter) Write(p []byte) (int, error) { c.writes++; return c.b.Write(p) }
