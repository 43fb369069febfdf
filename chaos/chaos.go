// Package chaos is kvtier's standing fault suite: each fault starts real
// processes (`kvtier serve`, `kvtier controller`, redis-server, versitygw)
// on loopback, puts them under load, breaks something the way production
// breaks it (SIGKILL, damaged files, a full disk, a hung store, dying or
// hostile clients, a lost peer or controller) and checks what kvtier
// promises afterwards (docs/reliability.md).
//
// Every fault returns a Report with the same counts: wrong bytes (bytes
// read back that differ from what was stored: must be 0), acknowledged-
// durable chunks lost (chunks a durable FLUSH covered that did not come
// back: must be 0), and how long the service took to recover. The suite
// runs as a test package (go test ./chaos, short by default) and as
// `kvtier chaos`, which prints the reports as a table.
//
// A fault is written against testing.TB so that it reuses the test
// helpers that start real processes (internal/servetest, internal/redistest,
// internal/procstop); outside go test, Run supplies a testing.TB of its own.
package chaos

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// Options size a run of the suite.
type Options struct {
	// Duration is how long each fault keeps its load running before and
	// after it breaks something (default 1 s: the CI budget). Longer runs
	// store more chunks and repeat kills.
	Duration time.Duration
}

func (o Options) load() time.Duration {
	if o.Duration <= 0 {
		return time.Second
	}
	return o.Duration
}

// rounds is how many times a fault that can repeat does so: once per
// 5 s of Duration, at least once.
func (o Options) rounds() int { return max(1, int(o.load()/(5*time.Second))) }

// Report is what one fault checked and what it counted.
type Report struct {
	Fault   string
	Checked string // what was verified, in a sentence
	// Stored counts chunks acknowledged by the daemon during the fault;
	// Durable those a durable FLUSH covered (or, for remote stores, that
	// the store acknowledged under a persistence setting that keeps them).
	Stored, Durable int
	// Verified counts chunks read back and compared byte for byte.
	Verified int
	// WrongBytes counts bytes read back that differ from what was stored.
	WrongBytes int
	// Lost counts acknowledged-durable chunks that did not come back:
	// every read of them missed, for as long as verify reads again.
	Lost int
	// Reread counts durable chunks that missed a read and came back on a
	// later one: the read failed (a remote store past its deadline is a
	// miss), not the store. Allowed, shown.
	Reread int
	// Dropped counts chunks the fault destroyed on purpose or that were
	// acknowledged but not yet durable and did not come back: allowed,
	// reported so the figure is visible.
	Dropped int
	// Recovery is how long after the fault was lifted (or the process
	// restarted) the service answered correctly again.
	Recovery time.Duration
	Notes    []string
	Skipped  string // why the fault did not run, when it did not
	Failed   bool
}

// Note appends a free-form observation to the report.
func (r *Report) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// OK reports whether the fault's invariants held.
func (r *Report) OK() bool { return !r.Failed && r.WrongBytes == 0 && r.Lost == 0 }

// Fault is one entry of the suite.
type Fault struct {
	Name string
	Doc  string // what the fault does, one line
	Run  func(t testing.TB, o Options, r *Report)
}

// Faults lists the suite in the order it runs.
func Faults() []Fault {
	return []Fault{
		{"sigkill-disk", "SIGKILL `kvtier serve` under a store load with a disk tier; restart on the same directory", sigkillDisk},
		{"disk-bitflip", "flip bits in disk records' payloads and headers while the daemon is down; restart", diskBitflip},
		{"disk-truncate", "truncate the newest disk segment mid-record while the daemon is down; restart", diskTruncate},
		{"disk-full", "fill the file system under the disk tier (a small tmpfs) while stores go on; free it", diskFull},
		{"redis-hung", "SIGSTOP the Redis under the daemon while chunks live only there; SIGCONT", redisHung},
		{"redis-killed", "SIGKILL the Redis (appendfsync always) under the daemon; restart it on its files", redisKilled},
		{"s3-hung-killed", "SIGSTOP, then SIGKILL and restart, the S3 server (versitygw) under the daemon", s3HungKilled},
		{"client-lease-death", "SIGKILL client processes holding store and retrieve leases", clientLeaseDeath},
		{"hostile-clients", "slowloris, random bytes and truncated frames on TCP and the local socket beside a good client", hostileClients},
		{"cluster-kill", "SIGKILL a peer daemon and the controller of a controller + 2 daemon cluster; restart both", clusterKill},
	}
}

// Header is the table's first lines, in Markdown.
const Header = "| fault | stored | durable | verified | wrong bytes | durable lost | dropped | recovery | result |\n" +
	"|---|---|---|---|---|---|---|---|---|\n"

// Row formats r as a line of the table.
func (r *Report) Row() string {
	res := "ok"
	switch {
	case r.Skipped != "":
		res = "skipped: " + r.Skipped
	case !r.OK():
		res = "FAILED"
	}
	rec := "—"
	if r.Recovery > 0 {
		rec = r.Recovery.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("| %s | %d | %d | %d | %d | %d | %d | %s | %s |\n",
		r.Fault, r.Stored, r.Durable, r.Verified, r.WrongBytes, r.Lost, r.Dropped, rec, res)
}

// Summary is the report as text: the table row's figures, what was
// checked and the notes.
func (r *Report) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: checked %s\n", r.Fault, r.Checked)
	fmt.Fprintf(&b, "  stored %d, durable %d, verified %d (re-read %d), wrong bytes %d, durable lost %d, dropped %d, recovery %v\n",
		r.Stored, r.Durable, r.Verified, r.Reread, r.WrongBytes, r.Lost, r.Dropped, r.Recovery.Round(time.Millisecond))
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  %s\n", n)
	}
	return b.String()
}
