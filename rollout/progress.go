package rollout

import (
	"fmt"
	"io"
	"strings"
)

// progress shows one changing status line: rewritten in place on a
// terminal, printed only when it changes otherwise (CI logs stay short).
type progress struct {
	out  io.Writer
	tty  bool
	last string
	live bool
}

func (p *progress) show(line string) {
	if p.tty {
		fmt.Fprintf(p.out, "\r\033[K%s", line)
		p.live = true
		return
	}
	// Leave out the elapsed time so an unchanged state prints once.
	key := line
	if i := strings.LastIndex(line, " · "); i >= 0 {
		key = line[:i]
	}
	if key != p.last {
		fmt.Fprintln(p.out, line)
		p.last = key
	}
}

func (p *progress) done() {
	if p.tty && p.live {
		fmt.Fprint(p.out, "\r\033[K")
		p.live = false
	}
}
