package h2relay

import (
	"bytes"
	"fmt"
	"io"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Writer turns a connection's Write* actions into frames in one buffer, so
// that the frames a turn of the loop made ready leave in one system call
// (Flush), and hands the other actions (deliveries for the relay) back. It
// owns the connection's HPACK encoder: header blocks are encoded per
// connection, in the order the frames are written, as HPACK requires.
type Writer struct {
	buf      bytes.Buffer
	fr       *http2.Framer
	hbuf     bytes.Buffer
	enc      *hpack.Encoder
	maxFrame uint32 // the peer's SETTINGS_MAX_FRAME_SIZE (header blocks are split at it)
}

// NewWriter returns a Writer for a connection whose peer accepts frames of
// up to maxFrame bytes (16 KiB until its SETTINGS say otherwise).
func NewWriter(maxFrame uint32) (*Writer, error) {
	if maxFrame < 1<<14 || maxFrame > 1<<24-1 {
		return nil, fmt.Errorf("h2relay: max frame size %d: want 2^14 to 2^24-1", maxFrame)
	}
	w := &Writer{maxFrame: maxFrame}
	w.fr = http2.NewFramer(&w.buf, nil)
	w.enc = hpack.NewEncoder(&w.hbuf)
	return w, nil
}

// Apply writes the frames acts ask for into the buffer, in order, and
// returns the actions that are not writes (appended to keep, which may be
// nil). A PeerSettings action also sizes the encoder's table.
func (w *Writer) Apply(acts []Action, keep []Action) ([]Action, error) {
	for i := range acts {
		a := &acts[i]
		var err error
		switch a.Kind {
		case WriteSettings:
			err = w.fr.WriteSettings(a.Settings...)
		case WriteSettingsAck:
			err = w.fr.WriteSettingsAck()
		case WritePing:
			err = w.fr.WritePing(a.Ack, a.Ping)
		case WriteWindowUpdate:
			err = w.fr.WriteWindowUpdate(a.Stream, a.N)
		case WriteRST:
			err = w.fr.WriteRSTStream(a.Stream, a.Code)
		case WriteGoAway:
			err = w.fr.WriteGoAway(a.Stream, a.Code, nil)
		case WriteData:
			err = w.fr.WriteData(a.Stream, a.End, a.Data)
		case WriteHeaders:
			err = w.writeHeaders(a)
		case PeerSettings:
			w.enc.SetMaxDynamicTableSizeLimit(a.HeaderTableSize)
		case PeerMaxFrame:
			w.SetMaxFrame(a.N)
		default:
			keep = append(keep, *a)
		}
		if err != nil {
			return keep, fmt.Errorf("h2relay: write %v frame: %w", a.Kind, err)
		}
	}
	return keep, nil
}

// writeHeaders encodes a header block and writes it as HEADERS and as many
// CONTINUATION frames as the peer's frame size needs.
func (w *Writer) writeHeaders(a *Action) error {
	w.hbuf.Reset()
	for _, f := range a.Fields {
		if err := w.enc.WriteField(f); err != nil {
			return err
		}
	}
	block := w.hbuf.Bytes()
	first := block[:min(len(block), int(w.maxFrame))]
	block = block[len(first):]
	if err := w.fr.WriteHeaders(http2.HeadersFrameParam{
		StreamID: a.Stream, BlockFragment: first, EndStream: a.End, EndHeaders: len(block) == 0,
	}); err != nil {
		return err
	}
	for len(block) > 0 {
		n := min(len(block), int(w.maxFrame))
		if err := w.fr.WriteContinuation(a.Stream, n == len(block), block[:n]); err != nil {
			return err
		}
		block = block[n:]
	}
	return nil
}

// SetMaxFrame follows the peer's SETTINGS_MAX_FRAME_SIZE.
func (w *Writer) SetMaxFrame(n uint32) {
	if n >= 1<<14 && n <= 1<<24-1 {
		w.maxFrame = n
	}
}

// WriteRaw adds bytes that are not frames (a client's connection preface)
// to the buffer.
func (w *Writer) WriteRaw(b []byte) { w.buf.Write(b) }

// Take appends the buffered bytes to dst and empties the buffer: the
// caller writes them (outside the connection's lock) while the next
// turn's frames gather.
func (w *Writer) Take(dst []byte) []byte {
	dst = append(dst, w.buf.Bytes()...)
	w.buf.Reset()
	if w.buf.Cap() > 256<<10 {
		w.buf = bytes.Buffer{} // do not keep a burst's worth of room
	}
	return dst
}

// Buffered is how many bytes wait for Flush.
func (w *Writer) Buffered() int { return w.buf.Len() }

// Flush writes every buffered frame to dst in one Write.
func (w *Writer) Flush(dst io.Writer) error {
	if w.buf.Len() == 0 {
		return nil
	}
	_, err := dst.Write(w.buf.Bytes())
	w.buf.Reset()
	return err
}
