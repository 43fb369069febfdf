package replay

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
)

// svgDoc is the part of the chart the tests read back.
type svgDoc struct {
	XMLName   xml.Name   `xml:"svg"`
	Texts     []string   `xml:"text"`
	Polylines []polyline `xml:"polyline"`
}

type polyline struct {
	Stroke string `xml:"stroke,attr"`
	Points string `xml:"points,attr"`
}

func decodeSVG(t *testing.T, data []byte) svgDoc {
	t.Helper()
	// Well-formed: every token decodes up to EOF.
	dec := xml.NewDecoder(bytes.NewReader(data))
	for {
		_, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v\n%s", err, data)
		}
	}
	var doc svgDoc
	if err := xml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	return doc
}

func TestWriteSVG(t *testing.T) {
	results := []Result{
		{Policy: "LRU", CapacityBlocks: 10, BlockRefs: 100, HitBlocks: 10},
		{Policy: "LRU", CapacityBlocks: 100, BlockRefs: 100, HitBlocks: 25},
		{Policy: "LRU", CapacityBlocks: 1000, BlockRefs: 100, HitBlocks: 30},
		{Policy: "S3<FIFO>&", CapacityBlocks: 10, BlockRefs: 100, HitBlocks: 12},
		{Policy: "S3<FIFO>&", CapacityBlocks: 1000, BlockRefs: 100, HitBlocks: 31},
		{Policy: OPT, CapacityBlocks: 10, BlockRefs: 100, HitBlocks: 20},
		{Policy: OPT, CapacityBlocks: 1000, BlockRefs: 100, HitBlocks: 36},
		{Policy: Infinite, BlockRefs: 100, HitBlocks: 36},
	}
	series := SeriesOf(results, 2000)
	if len(series) != 4 || series[0].Name != "LRU" || len(series[0].Points) != 3 || series[0].Points[1] != (Point{X: 5, Y: 25}) {
		t.Fatalf("SeriesOf = %+v", series)
	}
	if inf := series[3]; len(inf.Points) != 2 || inf.Points[0] != (Point{0.5, 36}) || inf.Points[1] != (Point{50, 36}) {
		t.Errorf("infinite series %+v, want a flat line at 36 from 0.5 to 50", inf)
	}
	var buf bytes.Buffer
	if err := WriteSVG(&buf, `hit rate <by> "policy" & capacity`, series...); err != nil {
		t.Fatal(err)
	}
	doc := decodeSVG(t, buf.Bytes())
	texts := strings.Join(doc.Texts, "\n")
	for _, want := range []string{`hit rate <by> "policy" & capacity`, "LRU", "S3<FIFO>&", OPT, Infinite, xLabel, yLabel} {
		if !strings.Contains(texts, want) {
			t.Errorf("chart has no text %q; texts:\n%s", want, texts)
		}
	}
	if len(doc.Polylines) != len(series) {
		t.Fatalf("%d lines for %d series", len(doc.Polylines), len(series))
	}
	for i, s := range series {
		if n := len(strings.Fields(doc.Polylines[i].Points)); n != len(s.Points) {
			t.Errorf("line %s has %d points, want %d", s.Name, n, len(s.Points))
		}
	}
	if doc.Polylines[2].Stroke != "black" {
		t.Errorf("OPT drawn in %q, want black", doc.Polylines[2].Stroke)
	}
	// 0.5..50% spans a factor of 100: the x axis is logarithmic, with 1-2-5 ticks.
	for _, tick := range []string{"0.5", "1", "2", "5", "10", "20", "50"} {
		if !slices.Contains(doc.Texts, tick) {
			t.Errorf("no x tick %q in %v", tick, doc.Texts)
		}
	}
}

func TestWriteSVGDegenerate(t *testing.T) {
	for name, series := range map[string][]Series{
		"none":        nil,
		"empty":       {{Name: "LRU"}},
		"one point":   {{Name: "LRU", Points: []Point{{10, 20}}}},
		"non-finite":  {{Name: "LRU", Points: []Point{{math.NaN(), 1}, {1, math.Inf(1)}, {2, 3}}}},
		"zero x":      {{Name: "LRU", Points: []Point{{0, 1}, {50, 3}}}},
		"control chr": {{Name: "a\x00b\x1b", Points: []Point{{1, 1}, {2, 2}}}},
	} {
		var buf bytes.Buffer
		if err := WriteSVG(&buf, name, series...); err != nil {
			t.Fatal(err)
		}
		doc := decodeSVG(t, buf.Bytes())
		if len(doc.Polylines) != len(series) {
			t.Errorf("%s: %d lines for %d series", name, len(doc.Polylines), len(series))
		}
		if strings.Contains(buf.String(), "NaN") || strings.Contains(buf.String(), "Inf") {
			t.Errorf("%s: non-finite coordinates in the SVG", name)
		}
	}
}

type brokenWriter struct{}

func (brokenWriter) Write([]byte) (int, error) { return 0, errors.New("pipe closed") }

func TestWriteSVGWriteError(t *testing.T) {
	if err := WriteSVG(brokenWriter{}, "t"); err == nil {
		t.Error("write error lost")
	}
}
