package fakecluster

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"

	"github.com/hashicorp/nomad/api"
)

// jobFilter is a parsed `filter` query parameter of /v1/jobs. Nomad
// evaluates go-bexpr expressions against the full job; the fake supports
// the subset callers of this repository use, and refuses the rest with
// Nomad's 400 rather than ignore it:
//
//	Meta["key"] == "value"     Meta["key"] != "value"
//	"key" in Meta              "key" not in Meta
//	ID == "x" (also Name, Namespace, Type, Status, NodePool)
//	a and b, a or b, not a, ( a )
type jobFilter func(*api.Job, string) bool

func parseJobFilter(expr string) (jobFilter, error) {
	p := &filterParser{src: expr}
	p.next()
	f, err := p.or()
	if err != nil {
		return nil, fmt.Errorf("failed to read filter expression: %w", err)
	}
	if p.tok.kind != tokEOF {
		return nil, fmt.Errorf("failed to read filter expression: unexpected %q at offset %d", p.tok.text, p.tok.pos)
	}
	return f, nil
}

type tokKind int

const (
	tokEOF tokKind = iota
	tokString
	tokIdent
	tokOp // == != ( ) [ ] .
)

type token struct {
	kind tokKind
	text string
	pos  int
}

type filterParser struct {
	src string
	pos int
	tok token
	err error
}

func (p *filterParser) next() {
	for p.pos < len(p.src) && unicode.IsSpace(rune(p.src[p.pos])) {
		p.pos++
	}
	start := p.pos
	if p.pos >= len(p.src) {
		p.tok = token{kind: tokEOF, pos: start}
		return
	}
	ch := p.src[p.pos]
	switch {
	case ch == '"' || ch == '`':
		end := p.pos + 1
		for end < len(p.src) && p.src[end] != ch {
			if p.src[end] == '\\' && ch == '"' {
				end++
			}
			end++
		}
		if end >= len(p.src) {
			p.err = fmt.Errorf("unterminated string at offset %d", start)
			p.tok = token{kind: tokEOF, pos: start}
			p.pos = len(p.src)
			return
		}
		raw := p.src[p.pos : end+1]
		text := raw[1 : len(raw)-1]
		if ch == '"' {
			if u, err := strconv.Unquote(raw); err == nil {
				text = u
			}
		}
		p.pos = end + 1
		p.tok = token{kind: tokString, text: text, pos: start}
	case strings.HasPrefix(p.src[p.pos:], "==") || strings.HasPrefix(p.src[p.pos:], "!="):
		p.tok = token{kind: tokOp, text: p.src[p.pos : p.pos+2], pos: start}
		p.pos += 2
	case strings.ContainsRune("()[].", rune(ch)):
		p.tok = token{kind: tokOp, text: string(ch), pos: start}
		p.pos++
	case unicode.IsLetter(rune(ch)) || ch == '_':
		end := p.pos
		for end < len(p.src) && (unicode.IsLetter(rune(p.src[end])) || unicode.IsDigit(rune(p.src[end])) || p.src[end] == '_' || p.src[end] == '-') {
			end++
		}
		p.tok = token{kind: tokIdent, text: p.src[p.pos:end], pos: start}
		p.pos = end
	default:
		p.tok = token{kind: tokOp, text: string(ch), pos: start}
		p.pos++
	}
}

func (p *filterParser) is(kind tokKind, text string) bool {
	return p.tok.kind == kind && (text == "" || p.tok.text == text)
}

func (p *filterParser) or() (jobFilter, error) {
	return p.joined("or", p.and, func(a, b bool) bool { return a || b })
}

func (p *filterParser) and() (jobFilter, error) {
	return p.joined("and", p.unary, func(a, b bool) bool { return a && b })
}

// joined reads operands separated by the keyword word, left to right.
func (p *filterParser) joined(word string, operand func() (jobFilter, error), join func(a, b bool) bool) (jobFilter, error) {
	left, err := operand()
	if err != nil {
		return nil, err
	}
	for p.is(tokIdent, word) {
		p.next()
		right, err := operand()
		if err != nil {
			return nil, err
		}
		l := left
		left = func(j *api.Job, ns string) bool { return join(l(j, ns), right(j, ns)) }
	}
	return left, nil
}

func (p *filterParser) unary() (jobFilter, error) {
	if p.err != nil {
		return nil, p.err
	}
	switch {
	case p.is(tokIdent, "not"):
		p.next()
		inner, err := p.unary()
		if err != nil {
			return nil, err
		}
		return func(j *api.Job, ns string) bool { return !inner(j, ns) }, nil
	case p.is(tokOp, "("):
		p.next()
		inner, err := p.or()
		if err != nil {
			return nil, err
		}
		if !p.is(tokOp, ")") {
			return nil, fmt.Errorf("missing ) at offset %d", p.tok.pos)
		}
		p.next()
		return inner, nil
	case p.is(tokString, ""):
		key := p.tok.text
		p.next()
		negate := false
		if p.is(tokIdent, "not") {
			negate = true
			p.next()
		}
		if !p.is(tokIdent, "in") {
			return nil, fmt.Errorf("unsupported by the fake cluster: want \"key\" in Meta at offset %d", p.tok.pos)
		}
		p.next()
		if !p.is(tokIdent, "Meta") {
			return nil, fmt.Errorf("unsupported by the fake cluster: only Meta is a supported collection (offset %d)", p.tok.pos)
		}
		p.next()
		return func(j *api.Job, _ string) bool {
			_, ok := j.Meta[key]
			return ok != negate
		}, nil
	case p.is(tokIdent, ""):
		sel, err := p.selector()
		if err != nil {
			return nil, err
		}
		if !p.is(tokOp, "==") && !p.is(tokOp, "!=") {
			return nil, fmt.Errorf("unsupported by the fake cluster: want == or != at offset %d", p.tok.pos)
		}
		neq := p.tok.text == "!="
		p.next()
		if !p.is(tokString, "") {
			return nil, fmt.Errorf("want a string value at offset %d", p.tok.pos)
		}
		want := p.tok.text
		p.next()
		return func(j *api.Job, ns string) bool {
			got, ok := sel(j, ns)
			return (ok && got == want) != neq
		}, nil
	}
	return nil, fmt.Errorf("unexpected %q at offset %d", p.tok.text, p.tok.pos)
}

// selector reads Meta["k"], Meta.k or a top-level string field.
func (p *filterParser) selector() (func(*api.Job, string) (string, bool), error) {
	name := p.tok.text
	p.next()
	if name == "Meta" {
		var key string
		switch {
		case p.is(tokOp, "["):
			p.next()
			if !p.is(tokString, "") {
				return nil, fmt.Errorf("want a quoted key after Meta[ at offset %d", p.tok.pos)
			}
			key = p.tok.text
			p.next()
			if !p.is(tokOp, "]") {
				return nil, fmt.Errorf("missing ] at offset %d", p.tok.pos)
			}
			p.next()
		case p.is(tokOp, "."):
			p.next()
			if !p.is(tokIdent, "") {
				return nil, fmt.Errorf("want a key after Meta. at offset %d", p.tok.pos)
			}
			key = p.tok.text
			p.next()
		default:
			return nil, fmt.Errorf("unsupported by the fake cluster: Meta without a key at offset %d", p.tok.pos)
		}
		return func(j *api.Job, _ string) (string, bool) {
			v, ok := j.Meta[key]
			return v, ok
		}, nil
	}
	field := map[string]func(*api.Job, string) string{
		"ID":        func(j *api.Job, _ string) string { return deref(j.ID) },
		"Name":      func(j *api.Job, _ string) string { return deref(j.Name) },
		"Type":      func(j *api.Job, _ string) string { return deref(j.Type) },
		"Status":    func(j *api.Job, _ string) string { return deref(j.Status) },
		"NodePool":  func(j *api.Job, _ string) string { return deref(j.NodePool) },
		"Namespace": func(_ *api.Job, ns string) string { return ns },
	}[name]
	if field == nil {
		return nil, fmt.Errorf("unsupported by the fake cluster: selector %q", name)
	}
	return func(j *api.Job, ns string) (string, bool) { return field(j, ns), true }, nil
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
