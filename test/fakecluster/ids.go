package fakecluster

import (
	"crypto/rand"
	"encoding/hex"
)

// newUUID returns a random ID in the 8-4-4-4-12 form Nomad and Consul use.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}
