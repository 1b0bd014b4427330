package simulate

import (
	"fmt"
	"html"
	"io"
	"sort"
	"strings"
	"time"
)

var palette = []string{"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"}

// SVG draws one panel per result, one under the other on a common time
// axis: the transfer slots each group held over time, stacked, out of
// slots.
func SVG(w io.Writer, results []Result, slots int) error {
	const width, panelH, left, right, top, gap = 900, 170, 60, 20, 50, 45
	height := top + len(results)*(panelH+gap)
	var end time.Duration
	groupSet := map[string]bool{}
	for _, r := range results {
		end = max(end, r.Duration)
		for _, g := range r.Groups {
			groupSet[g.Group] = true
		}
	}
	groups := make([]string, 0, len(groupSet))
	for g := range groupSet {
		groups = append(groups, g)
	}
	sort.Strings(groups)
	colour := map[string]string{}
	for i, g := range groups {
		colour[g] = palette[i%len(palette)]
	}
	if end <= 0 || slots <= 0 {
		return fmt.Errorf("nothing to draw")
	}
	plotW := float64(width - left - right)
	x := func(t time.Duration) float64 { return left + plotW*float64(t)/float64(end) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", width, height)
	// Legend.
	lx := float64(left)
	for _, g := range groups {
		fmt.Fprintf(&b, `<rect x="%.0f" y="14" width="12" height="12" fill="%s"/><text x="%.0f" y="24">%s</text>`+"\n", lx, colour[g], lx+16, html.EscapeString(g))
		lx += 24 + 7.5*float64(len(g))
	}
	for p, r := range results {
		y0 := float64(top + p*(panelH+gap) + 20)
		y := func(v float64) float64 { return y0 + panelH - panelH*v/float64(slots) }
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" font-weight="bold">%s</text>`+"\n", left, y0-6, html.EscapeString(r.Policy))
		base := make([]float64, len(r.Samples))
		for _, g := range groups {
			var up, down []string
			any := false
			for i, s := range r.Samples {
				v := float64(s.Running[g])
				any = any || v > 0
				up = append(up, fmt.Sprintf("%.1f,%.1f", x(s.At), y(base[i]+v)))
				down = append(down, fmt.Sprintf("%.1f,%.1f", x(s.At), y(base[i])))
				base[i] += v
			}
			if !any {
				continue
			}
			for i, j := 0, len(down)-1; i < j; i, j = i+1, j-1 {
				down[i], down[j] = down[j], down[i]
			}
			fmt.Fprintf(&b, `<polygon fill="%s" points="%s %s"/>`+"\n", colour[g], strings.Join(up, " "), strings.Join(down, " "))
		}
		// Axes: slots up the side, time along the bottom.
		fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="black"/>`+"\n", left, y(0), width-right, y(0))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.0f" x2="%d" y2="%.0f" stroke="black"/>`+"\n", left, y(0), left, y(float64(slots)))
		fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="end">%d</text><text x="%d" y="%.0f" text-anchor="end">0</text>`+"\n", left-4, y(float64(slots))+4, slots, left-4, y(0)+4)
		fmt.Fprintf(&b, `<text x="14" y="%.0f" transform="rotate(-90 14 %.0f)" text-anchor="middle">slots</text>`+"\n", y0+panelH/2, y0+panelH/2)
		step := tickStep(end)
		for t := time.Duration(0); t <= end; t += step {
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="black"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
				x(t), y(0), x(t), y(0)+4, x(t), y(0)+16, fmtMinutes(t))
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func tickStep(end time.Duration) time.Duration {
	for _, s := range []time.Duration{time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour, 2 * time.Hour, 6 * time.Hour} {
		if end/s <= 12 {
			return s
		}
	}
	return 24 * time.Hour
}

func fmtMinutes(t time.Duration) string {
	if t%time.Hour == 0 && t > 0 {
		return fmt.Sprintf("%dh", t/time.Hour)
	}
	return fmt.Sprintf("%dm", t/time.Minute)
}
