package chaos

import (
	"context"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"sync"
	"testing"
	"time"

	"kvtier/internal/servetest"
)

// Run runs the faults whose names match only (all when nil) outside go
// test, with bin as the kvtier binary the faults start, writing each
// fault's log lines and summary to w. It returns the reports in order.
func Run(o Options, bin string, only *regexp.Regexp, w io.Writer) []Report {
	servetest.UseBinary(bin)
	var out []Report
	for _, f := range Faults() {
		if only != nil && !only.MatchString(f.Name) {
			continue
		}
		r := Report{Fault: f.Name}
		fmt.Fprintf(w, "=== %s: %s\n", f.Name, f.Doc)
		t := newRunner(f.Name, w)
		start := time.Now()
		t.run(func() { f.Run(t, o, &r) })
		switch {
		case t.skipped:
			r.Skipped = t.skipMsg
		case t.failed:
			r.Failed = true
		}
		fmt.Fprint(w, r.Summary())
		fmt.Fprintf(w, "--- %s (%v)\n", map[bool]string{true: "ok", false: "FAILED"}[r.OK()], time.Since(start).Round(time.Millisecond))
		out = append(out, r)
	}
	return out
}

// runner is a testing.TB for running a fault outside go test. FailNow and
// SkipNow end the fault's goroutine with runtime.Goexit, as the testing
// package does, so a fault written for tests behaves the same here.
//
// It embeds testing.TB only to have the interface's unexported method; the
// embedded value is nil and every method of the interface is defined below.
type runner struct {
	testing.TB
	name string
	w    io.Writer

	mu       sync.Mutex
	failed   bool
	skipped  bool
	skipMsg  string
	cleanups []func()
	ctx      context.Context
	cancel   context.CancelFunc
}

func newRunner(name string, w io.Writer) *runner {
	ctx, cancel := context.WithCancel(context.Background())
	return &runner{name: name, w: w, ctx: ctx, cancel: cancel}
}

// run calls f in a goroutine of its own, then the cleanups, last first.
func (t *runner) run(f func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	<-done
	t.cancel()
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func (t *runner) Helper()      {}
func (t *runner) Name() string { return t.name }
func (t *runner) Log(args ...any) {
	fmt.Fprintf(t.w, "    %s", fmt.Sprintln(args...))
}
func (t *runner) Logf(format string, args ...any) {
	fmt.Fprintf(t.w, "    %s\n", fmt.Sprintf(format, args...))
}
func (t *runner) Fail() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
}
func (t *runner) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}
func (t *runner) FailNow()                          { t.Fail(); runtime.Goexit() }
func (t *runner) Error(args ...any)                 { t.Log(args...); t.Fail() }
func (t *runner) Errorf(format string, args ...any) { t.Logf(format, args...); t.Fail() }
func (t *runner) Fatal(args ...any)                 { t.Log(args...); t.FailNow() }
func (t *runner) Fatalf(format string, args ...any) { t.Logf(format, args...); t.FailNow() }
func (t *runner) SkipNow() {
	t.mu.Lock()
	t.skipped = true
	t.mu.Unlock()
	runtime.Goexit()
}
func (t *runner) Skip(args ...any) { t.skip(fmt.Sprint(args...)) }
func (t *runner) Skipf(format string, args ...any) {
	t.skip(fmt.Sprintf(format, args...))
}
func (t *runner) skip(msg string) {
	t.Log(msg)
	t.mu.Lock()
	t.skipMsg = msg
	t.mu.Unlock()
	t.SkipNow()
}
func (t *runner) Skipped() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.skipped
}
func (t *runner) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}
func (t *runner) TempDir() string {
	dir, err := os.MkdirTemp("", "kvtier-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
func (t *runner) Setenv(key, value string) {
	old, had := os.LookupEnv(key)
	os.Setenv(key, value)
	t.Cleanup(func() {
		if had {
			os.Setenv(key, old)
		} else {
			os.Unsetenv(key)
		}
	})
}
func (t *runner) Chdir(dir string) {
	old, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chdir(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chdir(old) })
}
func (t *runner) Context() context.Context { return t.ctx }
func (t *runner) Attr(key, value string)   { t.Logf("%s: %s", key, value) }
func (t *runner) Output() io.Writer        { return t.w }
func (t *runner) ArtifactDir() string      { return t.TempDir() }
