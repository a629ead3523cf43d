package consulroute

import (
	"context"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// The records watch decodes only what moved: at 10,000 services every
// answer is every record (issue 45).
func TestDecodeRecordsReusesUnmovedRecords(t *testing.T) {
	c, err := NewClient(&api.Config{Address: "127.0.0.1:1"}, WithReplica("x"))
	if err != nil {
		t.Fatal(err)
	}
	pair := func(name string, index uint64, value string) *api.KVPair {
		return &api.KVPair{Key: KVPrefix + "default/" + name, ModifyIndex: index, Value: []byte(value)}
	}
	cache := map[string]cachedRecord{}
	recs, idx := c.decodeRecords(context.Background(), api.KVPairs{
		pair("b", 5, `{"service":{"name":"b"},"latest":"b-00001"}`),
		pair("a", 4, `{"service":{"name":"a"},"latest":"a-00001"}`),
		pair("bad", 6, `{`),
	}, cache)
	if len(recs) != 2 || recs[0].Service.Name != "a" || recs[1].Service.Name != "b" || len(idx) != 2 {
		t.Fatalf("first answer: %+v %+v, want a and b, sorted, the unreadable one left out", recs, idx)
	}
	// a unchanged (a value that would not decode, so a decode shows),
	// b moved, bad gone.
	recs, idx2 := c.decodeRecords(context.Background(), api.KVPairs{
		pair("a", 4, `{`),
		pair("b", 7, `{"service":{"name":"b"},"latest":"b-00002"}`),
	}, cache)
	if len(recs) != 2 || recs[0].Latest != "a-00001" || recs[1].Latest != "b-00002" {
		t.Fatalf("second answer: %+v, want a from the cache and b decoded again", recs)
	}
	if idx2[0] != idx[0] || idx2[1] == idx[1] {
		t.Errorf("indexes %+v then %+v: a's must stay, b's must move", idx, idx2)
	}
	if _, ok := cache[KVPrefix+"default/bad"]; ok || len(cache) != 2 {
		t.Errorf("cache %v: want only the keys of the last answer", cache)
	}
}

func TestRecordsGap(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 300: 15 * time.Millisecond, 10000: 500 * time.Millisecond, 100000: time.Second} {
		if got := recordsGap(n); got != want {
			t.Errorf("recordsGap(%d) = %s, want %s", n, got, want)
		}
	}
}

func TestPassingPacedByTheQuerysCost(t *testing.T) {
	var q queryCost
	if q.estimate() != 0 {
		t.Fatal("no answer yet: want no gap")
	}
	// Answers that waited for a change (a second) and ones that came at
	// once (20 ms): the cost is what the prompt ones took.
	for _, d := range []time.Duration{time.Second, 20 * time.Millisecond, 900 * time.Millisecond, 25 * time.Millisecond} {
		q.add(d)
	}
	if got := q.estimate(); got != 20*time.Millisecond {
		t.Errorf("estimate %s, want 20ms", got)
	}
	if got := passingGap(q.estimate()); got != 180*time.Millisecond {
		t.Errorf("gap %s, want 180ms", got)
	}
	if got := passingGap(150 * time.Millisecond); got != 1350*time.Millisecond {
		t.Errorf("gap after a 150 ms answer %s, want 1350ms", got)
	}
	if got := passingGap(time.Second); got != 2*time.Second {
		t.Errorf("gap after a 1 s answer %s, want the 2s cap", got)
	}
	// Only the last 8 count.
	for range 8 {
		q.add(40 * time.Millisecond)
	}
	if got := q.estimate(); got != 40*time.Millisecond {
		t.Errorf("estimate %s after 8 answers of 40ms, want 40ms", got)
	}
}
