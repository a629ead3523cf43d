// Command growth reads `go test -bench` output on stdin, passes it through,
// and then prints, for every benchmark with sub-benchmarks named
// revisions=N, how its time per operation grows from one size to the next
// (issue 45's simulation benchmarks: 1k, 10k, 100k revisions). A factor
// near the size ratio (10) is linear; near its square (100), quadratic.
// It exits non-zero when a factor reaches the square of its size ratio, or
// when the input has a FAIL line.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// line matches "BenchmarkX/revisions=1000/case-2   5   276533 ns/op ...".
var line = regexp.MustCompile(`^(Benchmark\S*?)/?revisions=(\d+)(/\S*?)?(-\d+)?\s+\d+\s+([\d.]+) ns/op`)

type point struct {
	n  int
	ns float64
}

func main() {
	series := map[string][]point{}
	var order []string
	failed := false
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		text := sc.Text()
		fmt.Println(text)
		failed = failed || strings.HasPrefix(text, "FAIL")
		m := line.FindStringSubmatch(text)
		if m == nil {
			continue
		}
		n, _ := strconv.Atoi(m[2])
		ns, _ := strconv.ParseFloat(m[5], 64)
		name := m[1] + m[3]
		if _, ok := series[name]; !ok {
			order = append(order, name)
		}
		series[name] = append(series[name], point{n, ns})
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "growth:", err)
		os.Exit(2)
	}
	quadratic := false
	fmt.Println("\ngrowth of ns/op from one revision count to the next (x10 revisions: 10 is linear, 100 quadratic)")
	for _, name := range order {
		ps := series[name]
		sort.Slice(ps, func(i, j int) bool { return ps[i].n < ps[j].n })
		var parts []string
		for i := 1; i < len(ps); i++ {
			ratio := float64(ps[i].n) / float64(ps[i-1].n)
			f := ps[i].ns / ps[i-1].ns
			mark := ""
			if f >= ratio*ratio {
				mark, quadratic = " QUADRATIC", true
			}
			parts = append(parts, fmt.Sprintf("%d->%d x%.1f%s", ps[i-1].n, ps[i].n, f, mark))
		}
		fmt.Printf("  %-60s %s\n", name, strings.Join(parts, "  "))
	}
	if quadratic || failed {
		os.Exit(1)
	}
}
