package e2e

import (
	"sync"
	"testing"
	"time"
)

func TestSplitterWatchSeesARevisionLeave(t *testing.T) {
	var mu sync.Mutex
	seq := []map[string]float32{{"a": 100}, {"a": 90, "b": 10}, {"a": 90, "b": 10}, {"a": 100}, {"a": 100}}
	i := 0
	w := startSplitterWatch(func() (map[string]float32, error) {
		mu.Lock()
		defer mu.Unlock()
		m := seq[min(i, len(seq)-1)]
		i++
		return m, nil
	}, time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for {
		mu.Lock()
		n := i
		mu.Unlock()
		if n > len(seq) || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	w.Stop()
	if _, ok := w.zero("b"); !ok {
		t.Errorf("b left the splitter unseen: %s", w)
	}
	if _, ok := w.zero("a"); ok {
		t.Errorf("a never left, yet it has a zero time: %s", w)
	}
}
