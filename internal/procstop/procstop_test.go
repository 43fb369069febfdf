package procstop

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestStopWaitsForTheStop(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Skip("no sleep binary:", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	if ok, err := allStopped(cmd.Process.Pid); err != nil || ok {
		t.Fatalf("a running process reads as stopped=%v, err %v", ok, err)
	}
	if err := Stop(cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if ok, err := allStopped(cmd.Process.Pid); err != nil || !ok {
		t.Fatalf("after Stop: stopped=%v, err %v", ok, err)
	}
	syscall.Kill(cmd.Process.Pid, syscall.SIGCONT)
}
