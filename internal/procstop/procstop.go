// Package procstop hangs a process for fault tests: SIGSTOP, then wait
// until every thread of it is stopped. kill(2) returns once the signal is
// queued, before a thread running on another CPU has taken it, so a test
// that asks the "hung" process right away can still get an answer — and
// on a busy machine does, now and then.
package procstop

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
)

// Stop sends SIGSTOP to pid and returns once /proc shows every one of its
// threads stopped, or an error after limit.
func Stop(pid int, limit time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	deadline := time.Now().Add(limit)
	for {
		stopped, err := allStopped(pid)
		if err != nil {
			return err
		}
		if stopped {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d not stopped %v after SIGSTOP", pid, limit)
		}
		time.Sleep(time.Millisecond)
	}
}

// allStopped reports whether every thread of pid is in state T (stopped)
// or t (traced).
func allStopped(pid int) (bool, error) {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	seen := 0
	for _, task := range tasks {
		stat, err := os.ReadFile(dir + "/" + task.Name() + "/stat")
		if err != nil {
			continue // the thread exited
		}
		// The state follows the command name, which is in parentheses and
		// may itself hold spaces or parentheses: read after the last ')'.
		i := strings.LastIndexByte(string(stat), ')')
		fields := strings.Fields(string(stat[i+1:]))
		if i < 0 || len(fields) == 0 {
			return false, fmt.Errorf("%s/%s/stat: unexpected format", dir, task.Name())
		}
		if fields[0] != "T" && fields[0] != "t" {
			return false, nil
		}
		seen++
	}
	return seen > 0, nil
}
