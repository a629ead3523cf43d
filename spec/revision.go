package spec

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// GenerationDigits is the width of a revision's generation number.
const GenerationDigits = 5

// MaxGeneration is the last generation a service can have.
const MaxGeneration = 99999

// Revision is one immutable snapshot of a service's template.
type Revision struct {
	Service    string `json:"service"`
	Namespace  string `json:"namespace"`
	Generation int    `json:"generation"`
	// SpecHash is Template.Hash() at the time the revision was made.
	SpecHash string   `json:"spec_hash"`
	Template Template `json:"template"`
	// Scaling is the service's current scaling; it is applied to the
	// revision in place and is not part of its identity.
	Scaling Scaling `json:"scaling"`
}

// Name is the revision's name: <service>-<00001>. It is the Nomad job ID and
// the Consul service name.
func (r Revision) Name() string { return RevisionName(r.Service, r.Generation) }

// NewRevision makes generation gen of s.
func NewRevision(s *Service, gen int) Revision {
	return Revision{
		Service:    s.Name,
		Namespace:  s.Namespace,
		Generation: gen,
		SpecHash:   s.Template.Hash(),
		Template:   s.Template,
		Scaling:    s.Scaling,
	}
}

// RevisionName formats a revision name.
func RevisionName(service string, generation int) string {
	return fmt.Sprintf("%s-%0*d", service, GenerationDigits, generation)
}

// ParseRevisionName splits "hello-00002" into ("hello", 2). ok is false when
// name is not a revision name.
func ParseRevisionName(name string) (service string, generation int, ok bool) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 || len(name)-i-1 != GenerationDigits {
		return "", 0, false
	}
	tail := name[i+1:]
	for _, c := range tail {
		if c < '0' || c > '9' {
			return "", 0, false
		}
	}
	g, err := strconv.Atoi(tail)
	if err != nil || g < 1 {
		return "", 0, false
	}
	return name[:i], g, true
}

// Hash is the template's identity: a digest of its canonical JSON form
// (encoding/json writes map keys sorted, so equal templates hash equally).
// Scaling, traffic and domains are outside the template and do not change it.
func (t Template) Hash() string {
	b, err := json.Marshal(t)
	if err != nil {
		// Template holds only JSON-encodable values by construction (the
		// HCL decoder converts driver config to plain Go values).
		panic(fmt.Sprintf("spec: template is not JSON-encodable: %v", err))
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}
