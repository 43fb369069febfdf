// Package scale measures how kvtier's per-item costs grow with the number
// of items: metadata bytes per chunk in the RAM tier and the disk index,
// the disk tier's restart time per record (after a crash, after a clean
// stop, and with a full scan), lookup latency against the number of stored
// chunks, the router index's memory and score latency, and eviction cost
// per chunk under churn. `kvtier bench scale` runs it; docs/scale.md holds
// the figures.
package scale

import (
	"context"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"kvtier/chunk"
	"kvtier/tier/disk"
	"kvtier/tier/policy"
)

// Options choose what Run measures. Zero counts skip a part.
type Options struct {
	Dir          string // directory for the disk tier (a real disk)
	DiskRecords  []int
	DiskTail     int  // records stored after the last checkpoint before the SIGKILL
	Restarts     int  // times the restarts at the largest record count are repeated
	RestartsOnly bool // only the repeated restarts, of a directory filled before
	RAMChunks    []int
	ChurnChunks  []int
	RouterBlocks []int
	RouterPods   int
	Rounds       int
}

// Full is the published run: 10k to 1M disk records, 10k to 10M chunks in
// RAM, churn up to 1M chunks, the router at up to 10M blocks × 64 pods.
func Full(dir string) Options {
	return Options{
		Dir:          dir,
		DiskRecords:  []int{10_000, 100_000, 1_000_000},
		DiskTail:     disk.DefaultCheckpointRecords - 1,
		Restarts:     5,
		RAMChunks:    []int{10_000, 100_000, 1_000_000, 10_000_000},
		ChurnChunks:  []int{10_000, 100_000, 1_000_000},
		RouterBlocks: []int{100_000, 1_000_000, 10_000_000},
		RouterPods:   64,
		Rounds:       3,
	}
}

// Quick is a small run that checks the command works (CI).
func Quick(dir string) Options {
	return Options{
		Dir:          dir,
		DiskRecords:  []int{500, 2000},
		DiskTail:     200,
		Restarts:     2,
		RAMChunks:    []int{1000, 10_000},
		ChurnChunks:  []int{1000},
		RouterBlocks: []int{10_000},
		RouterPods:   8,
		Rounds:       1,
	}
}

// Result is everything Run measured.
type Result struct {
	Machine string
	LoadAvg [2]string // /proc/loadavg's 1-minute figure at start and end
	Disk    []DiskRow
	Restart []Restart
	// RestartRecords is the record count of the repeated restarts.
	RestartRecords int
	RAM            []RAMRow
	Churn          []ChurnRow
	Router         []RouterRow
	Took           time.Duration
}

// Run measures every part o asks for, logging progress to log.
func Run(ctx context.Context, o Options, log io.Writer) (*Result, error) {
	start := time.Now()
	r := &Result{Machine: machine()}
	r.LoadAvg[0] = loadAvg()
	var err error
	if len(o.DiskRecords) > 0 {
		if !o.RestartsOnly {
			if r.Disk, err = Disk(ctx, o.Dir, o.DiskRecords, o.DiskTail, log); err != nil {
				return r, fmt.Errorf("disk: %w", err)
			}
		}
		n := o.DiskRecords[len(o.DiskRecords)-1]
		r.RestartRecords = n
		if r.Restart, err = Restarts(ctx, o.Dir, n, o.DiskTail, o.Restarts, log); err != nil {
			return r, fmt.Errorf("disk restarts: %w", err)
		}
	}
	if len(o.RAMChunks) > 0 {
		fmt.Fprintln(log, "ram: metadata and lookups")
		if r.RAM, err = RAM(o.RAMChunks, "", o.Rounds); err != nil {
			return r, fmt.Errorf("ram: %w", err)
		}
	}
	if len(o.ChurnChunks) > 0 {
		fmt.Fprintln(log, "churn: eviction per policy")
		if r.Churn, err = Churn(o.ChurnChunks, o.Rounds); err != nil {
			return r, fmt.Errorf("churn: %w", err)
		}
	}
	if len(o.RouterBlocks) > 0 {
		fmt.Fprintln(log, "router: index memory and scores")
		if r.Router, err = Router(o.RouterBlocks, o.RouterPods, o.Rounds); err != nil {
			return r, fmt.Errorf("router: %w", err)
		}
	}
	r.LoadAvg[1] = loadAvg()
	r.Took = time.Since(start).Round(time.Second)
	return r, nil
}

func defaultPolicy() string {
	p, err := policy.New[chunk.Key]("")
	if err != nil {
		return "?"
	}
	return p.Name()
}

func machine() string {
	return fmt.Sprintf("%d CPUs (GOMAXPROCS %d), %s/%s, %s", runtime.NumCPU(), runtime.GOMAXPROCS(0),
		runtime.GOOS, runtime.GOARCH, runtime.Version())
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

// Print writes r as Markdown tables.
func (r *Result) Print(w io.Writer) {
	fmt.Fprintf(w, "Machine: %s; load average %s at start, %s at end; took %v.\n\n", r.Machine, r.LoadAvg[0], r.LoadAvg[1], r.Took)
	if len(r.Disk) > 0 {
		fmt.Fprintln(w, "Disk tier restart (512-byte payloads, page cache emptied of the tier's files before each Open):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| records | full scan | µs/record | clean stop | µs/record | CPU | policy ready | crash (SIGKILL) | log records read | µs/record | CPU | policy ready | full/clean | index heap B/record | checkpoint B/record |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, d := range r.Disk {
			fmt.Fprintf(w, "| %d | %v | %.1f | %v | %.2f | %v | %v | %v | %d | %.2f | %v | %v | %.0f× | %.0f | %.0f |\n", d.Records,
				d.FullScan.Round(time.Millisecond), d.PerRecord(d.FullScan),
				d.CleanStop.Round(time.Millisecond), d.PerRecord(d.CleanStop), d.CleanCPU.Round(time.Millisecond),
				d.CleanPolicy.Round(time.Millisecond),
				d.Crash.Round(time.Millisecond), d.CrashScanned, d.PerRecord(d.Crash), d.CrashCPU.Round(time.Millisecond),
				d.CrashPolicy.Round(time.Millisecond),
				float64(d.FullScan)/float64(d.CleanStop), d.IndexBytes, d.CheckpointB)
		}
		fmt.Fprintln(w)
	}
	if len(r.Restart) > 0 {
		printRestarts(w, r.RestartRecords, r.Restart)
	}
	if len(r.RAM) > 0 {
		fmt.Fprintf(w, "RAM tier (%s, the default policy): heap metadata per chunk and a 128-chunk prefix lookup (PrefixContains, CPU time) of stored chunks drawn at random:\n", defaultPolicy())
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| chunks | heap B/chunk | lookup | ns/key | vs 128 stored |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|")
		for _, m := range r.RAM {
			fmt.Fprintf(w, "| %d | %.0f | %v | %.1f | %.2f× |\n", m.Chunks, m.HeapBytes, m.Lookup, PerKey(m.Lookup),
				float64(m.Lookup)/float64(m.LookupBase))
		}
		fmt.Fprintln(w)
	}
	if len(r.Churn) > 0 {
		fmt.Fprintln(w, "RAM tier under churn: CPU time of storing a chunk into a full tier (one eviction each) against a tier with room:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| policy | chunks | full: ns/chunk | room: ns/chunk | eviction ns/chunk | full/room |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|")
		for _, c := range r.Churn {
			fmt.Fprintf(w, "| %s | %d | %d | %d | %d | %.2f× |\n", c.Policy, c.Chunks, c.Churn.Nanoseconds(),
				c.Room.Nanoseconds(), c.Evict().Nanoseconds(), float64(c.Churn)/float64(c.Room))
		}
		fmt.Fprintln(w)
	}
	if len(r.Router) > 0 {
		fmt.Fprintln(w, "Router index: blocks spread over the pods (one holder each) plus a 128-block prompt every pod holds; LongestPrefix score of that prompt (CPU time):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| blocks | pods | heap B/block | score | vs prompt-only index |")
		fmt.Fprintln(w, "|---:|---:|---:|---:|---:|")
		for _, x := range r.Router {
			fmt.Fprintf(w, "| %d | %d | %.0f | %v | %.2f× |\n", x.Blocks, x.Pods, x.HeapBytes, x.Score,
				float64(x.Score)/float64(x.ScoreSmall))
		}
		fmt.Fprintln(w)
	}
}

// printRestarts writes the repeated restarts and their medians.
func printRestarts(w io.Writer, n int, rs []Restart) {
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	fmt.Fprintf(w, "Disk tier restart at %d records, repeated (each run stores the log tail again and is SIGKILLed; wall time until Open returns, CPU time of Open, wall time until the policy had every record):\n\n", n)
	fmt.Fprintln(w, "| run | load average | crash | CPU | policy ready | log records read | clean stop | CPU | policy ready |")
	fmt.Fprintln(w, "|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for i, x := range rs {
		fmt.Fprintf(w, "| %d | %s | %v | %v | %v | %d | %v | %v | %v |\n", i+1, x.Load, ms(x.Crash), ms(x.CrashCPU), ms(x.CrashPol),
			x.CrashRead, ms(x.Clean), ms(x.CleanCPU), ms(x.CleanPol))
	}
	col := func(f func(Restart) time.Duration) string {
		ds := make([]time.Duration, len(rs))
		for i, x := range rs {
			ds[i] = f(x)
		}
		slices.Sort(ds)
		return fmt.Sprintf("%v (%v–%v)", ms(ds[len(ds)/2]), ms(ds[0]), ms(ds[len(ds)-1]))
	}
	fmt.Fprintf(w, "| median (min–max) | | %s | %s | %s | | %s | %s | %s |\n\n",
		col(func(x Restart) time.Duration { return x.Crash }), col(func(x Restart) time.Duration { return x.CrashCPU }),
		col(func(x Restart) time.Duration { return x.CrashPol }), col(func(x Restart) time.Duration { return x.Clean }),
		col(func(x Restart) time.Duration { return x.CleanCPU }), col(func(x Restart) time.Duration { return x.CleanPol }))
}

// Select narrows o to the named parts (comma-separated: disk, restarts,
// ram, churn, router; empty keeps them all), with other disk record counts
// and repeated restarts when given (records empty, restarts 0: keep o's).
// "restarts" alone repeats the restarts of a directory an earlier run
// filled to the last record count, without refilling it first.
func (o *Options) Select(parts string, records []int, restarts int) error {
	if len(records) > 0 {
		o.DiskRecords = records
	}
	if restarts > 0 {
		o.Restarts = restarts
	}
	if parts == "" {
		return nil
	}
	keep := map[string]bool{}
	for _, p := range strings.Split(parts, ",") {
		switch p = strings.TrimSpace(p); p {
		case "disk", "restarts", "ram", "churn", "router":
			keep[p] = true
		default:
			return fmt.Errorf("scale: unknown part %q (valid: disk, restarts, ram, churn, router)", p)
		}
	}
	o.RestartsOnly = keep["restarts"] && !keep["disk"]
	if !keep["disk"] && !keep["restarts"] {
		o.DiskRecords = nil
	}
	if !keep["restarts"] {
		o.Restarts = 0
	}
	if !keep["ram"] {
		o.RAMChunks = nil
	}
	if !keep["churn"] {
		o.ChurnChunks = nil
	}
	if !keep["router"] {
		o.RouterBlocks = nil
	}
	return nil
}
