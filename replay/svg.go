package replay

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strings"
)

// Series is one line of a hit-rate chart.
type Series struct {
	Name   string
	Points []Point
}

// Point is one measurement: X is the cache capacity in percent of the
// trace's distinct blocks, Y the block hit rate in percent.
type Point struct{ X, Y float64 }

// SeriesOf groups results into one series per policy, in the order the
// policies first appear. An Infinite result becomes a flat line across
// the capacities of the others.
func SeriesOf(results []Result, distinctBlocks int) []Series {
	var out []Series
	at := map[string]int{}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range results {
		if _, ok := at[r.Policy]; !ok {
			at[r.Policy] = len(out)
			out = append(out, Series{Name: r.Policy})
		}
		if r.Policy == Infinite || distinctBlocks <= 0 {
			continue
		}
		x := 100 * float64(r.CapacityBlocks) / float64(distinctBlocks)
		lo, hi = min(lo, x), max(hi, x)
		s := &out[at[r.Policy]]
		s.Points = append(s.Points, Point{X: x, Y: 100 * r.HitRate()})
	}
	for _, r := range results {
		if r.Policy == Infinite && lo <= hi {
			s := &out[at[r.Policy]]
			s.Points = []Point{{lo, 100 * r.HitRate()}, {hi, 100 * r.HitRate()}}
		}
	}
	return out
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH        = 900, 540
	plotL, plotR          = 80, 700 // x extent of the plot area; the legend sits right of it
	plotT, plotB          = 60, 470
	xLabel                = "cache capacity (% of distinct blocks)"
	yLabel                = "block hit rate (%)"
	logScaleMinimumSpread = 20 // max/min capacity ratio from which x is logarithmic
)

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22"}

// WriteSVG draws a self-contained SVG line chart of hit rate (y, %) against
// capacity (x, % of distinct blocks) with one line per series and a legend.
// OPT is drawn dashed black and Infinite dotted grey. The x axis is
// logarithmic when the capacities span a factor of 20 or more.
func WriteSVG(w io.Writer, title string, series ...Series) error {
	ax := newAxes(series)
	var b bytes.Buffer
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %[1]d %[2]d" font-family="sans-serif" font-size="13">`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="32" font-size="17" font-weight="bold">%s</text>`+"\n", plotL, escape(title))
	ax.drawGrid(&b)
	for i, s := range series {
		drawSeries(&b, ax, s, i)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="black"/>`+"\n", plotL, plotT, plotR-plotL, plotB-plotT)
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", (plotL+plotR)/2, chartH-20, escape(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(24 %d) rotate(-90)" text-anchor="middle">%s</text>`+"\n", (plotT+plotB)/2, escape(yLabel))
	b.WriteString("</svg>\n")
	_, err := w.Write(b.Bytes())
	return err
}

// axes maps data to the plot area.
type axes struct {
	log            bool
	xMin, xMax     float64
	yMax           float64
	xTicks, yTicks []float64
}

func newAxes(series []Series) axes {
	a := axes{xMin: math.Inf(1), xMax: math.Inf(-1)}
	for _, s := range series {
		for _, p := range s.Points {
			if finite(p) {
				a.xMin, a.xMax, a.yMax = min(a.xMin, p.X), max(a.xMax, p.X), max(a.yMax, p.Y)
			}
		}
	}
	if a.xMin > a.xMax { // no data
		a.xMin, a.xMax = 0, 100
	}
	a.log = a.xMin > 0 && a.xMax/a.xMin >= logScaleMinimumSpread
	if a.log {
		a.xTicks = logTicks(a.xMin, a.xMax)
	} else {
		if a.xMin == a.xMax {
			a.xMin, a.xMax = a.xMin-1, a.xMax+1
		}
		a.xTicks = linearTicks(a.xMin, a.xMax)
	}
	a.yMax = niceCeil(max(a.yMax, 1))
	a.yTicks = linearTicks(0, a.yMax)
	return a
}

func finite(p Point) bool {
	return !math.IsNaN(p.X) && !math.IsInf(p.X, 0) && !math.IsNaN(p.Y) && !math.IsInf(p.Y, 0)
}

func (a axes) x(v float64) float64 {
	f := (v - a.xMin) / (a.xMax - a.xMin)
	if a.log {
		f = math.Log(v/a.xMin) / math.Log(a.xMax/a.xMin)
	}
	return plotL + f*(plotR-plotL)
}

func (a axes) y(v float64) float64 {
	return plotB - v/a.yMax*(plotB-plotT)
}

func (a axes) drawGrid(b *bytes.Buffer) {
	for _, t := range a.xTicks {
		x := a.x(t)
		fmt.Fprintf(b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", x, plotT, x, plotB)
		fmt.Fprintf(b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, plotB+18, formatTick(t))
	}
	for _, t := range a.yTicks {
		y := a.y(t)
		fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", plotL, y, plotR, y)
		fmt.Fprintf(b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", plotL-6, y+4, formatTick(t))
	}
}

func drawSeries(b *bytes.Buffer, a axes, s Series, i int) {
	color, dash, width := palette[i%len(palette)], "", 2
	switch strings.ToUpper(s.Name) {
	case OPT:
		color, dash, width = "black", ` stroke-dasharray="8 4"`, 2
	case Infinite:
		color, dash, width = "#888", ` stroke-dasharray="2 4"`, 2
	}
	var pts strings.Builder
	for _, p := range s.Points {
		if !finite(p) || a.log && p.X <= 0 {
			continue
		}
		fmt.Fprintf(&pts, "%.1f,%.1f ", a.x(p.X), a.y(p.Y))
	}
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="%d"%s points="%s"/>`+"\n", color, width, dash, strings.TrimSpace(pts.String()))
	ly := float64(plotT + 10 + 22*i)
	fmt.Fprintf(b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s" stroke-width="%d"%s/>`+"\n", plotR+16, ly, plotR+46, ly, color, width, dash)
	fmt.Fprintf(b, `<text x="%d" y="%.1f">%s</text>`+"\n", plotR+54, ly+4, escape(s.Name))
}

// linearTicks returns round values from lo to hi, about five of them.
func linearTicks(lo, hi float64) []float64 {
	step := niceCeil((hi - lo) / 5)
	var ticks []float64
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9; t += step {
		ticks = append(ticks, t)
	}
	return ticks
}

// logTicks returns the 1-2-5 values between lo and hi.
func logTicks(lo, hi float64) []float64 {
	var ticks []float64
	for decade := math.Pow(10, math.Floor(math.Log10(lo))); decade <= hi; decade *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if t := m * decade; t >= lo*(1-1e-9) && t <= hi*(1+1e-9) {
				ticks = append(ticks, t)
			}
		}
	}
	return ticks
}

// niceCeil rounds v > 0 up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

func formatTick(v float64) string {
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.3f", v), "0"), ".")
}

func escape(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s)) // writes to a strings.Builder never fail
	return b.String()
}
