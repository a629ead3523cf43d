package e2e

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// Timings collects durations the scenarios measure, for the table printed at
// the end of the run. Safe for concurrent use.
type Timings struct {
	mu   sync.Mutex
	rows []TimingRow
}

// TimingRow is one measure of one scenario: every value measured, in order.
type TimingRow struct {
	Scenario, Measure string
	Values            []time.Duration
	// Note is printed after the numbers (a target, a count).
	Note string
}

func (t *Timings) row(scenario, measure string) *TimingRow {
	for i := range t.rows {
		if t.rows[i].Scenario == scenario && t.rows[i].Measure == measure {
			return &t.rows[i]
		}
	}
	t.rows = append(t.rows, TimingRow{Scenario: scenario, Measure: measure})
	return &t.rows[len(t.rows)-1]
}

// Add records one value of a measure.
func (t *Timings) Add(scenario, measure string, d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.row(scenario, measure)
	r.Values = append(r.Values, d)
}

// Note sets a measure's note.
func (t *Timings) Note(scenario, measure, note string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.row(scenario, measure).Note = note
}

// Rows returns a copy of the rows in the order they were first added.
func (t *Timings) Rows() []TimingRow {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]TimingRow, len(t.rows))
	for i, r := range t.rows {
		out[i] = r
		out[i].Values = slices.Clone(r.Values)
	}
	return out
}

// Median is the middle value (the mean of the two middle ones for an even
// count); 0 for none.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// FormatDuration prints a duration for the table: milliseconds with one
// decimal under 10 s, seconds with two above.
func FormatDuration(d time.Duration) string {
	if d >= 10*time.Second || d <= -10*time.Second {
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}

// FormatTable renders rows as an aligned text table: scenario, measure,
// count, median, min, max and every value (up to eight), then the note.
func FormatTable(rows []TimingRow) string {
	header := []string{"scenario", "measure", "n", "median", "min", "max", "values", "note"}
	cells := [][]string{header}
	for _, r := range rows {
		line := []string{r.Scenario, r.Measure, fmt.Sprint(len(r.Values)), "-", "-", "-", "-", r.Note}
		if len(r.Values) > 0 {
			line[3] = FormatDuration(Median(r.Values))
			line[4] = FormatDuration(slices.Min(r.Values))
			line[5] = FormatDuration(slices.Max(r.Values))
			var vs []string
			for i, v := range r.Values {
				if i == 8 {
					vs = append(vs, fmt.Sprintf("(+%d)", len(r.Values)-8))
					break
				}
				vs = append(vs, FormatDuration(v))
			}
			line[6] = strings.Join(vs, " ")
		}
		cells = append(cells, line)
	}
	widths := make([]int, len(header))
	for _, c := range cells {
		for i, s := range c {
			widths[i] = max(widths[i], len(s))
		}
	}
	var b strings.Builder
	for n, c := range cells {
		for i, s := range c {
			if i == len(c)-1 {
				b.WriteString(s)
				break
			}
			// Numbers right-aligned, text left-aligned.
			if i >= 2 && i <= 5 {
				fmt.Fprintf(&b, "%*s  ", widths[i], s)
			} else {
				fmt.Fprintf(&b, "%-*s  ", widths[i], s)
			}
		}
		b.WriteString("\n")
		if n == 0 {
			total := len(widths) * 2
			for _, w := range widths {
				total += w
			}
			b.WriteString(strings.Repeat("-", total-2) + "\n")
		}
	}
	// No trailing spaces on lines whose note is empty.
	lines := strings.Split(b.String(), "\n")
	for i := range lines {
		lines[i] = strings.TrimRight(lines[i], " ")
	}
	return strings.Join(lines, "\n")
}
