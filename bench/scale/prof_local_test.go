package scale

import (
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"testing"
	"time"

	"kvtier/tier/disk"
)

func TestProfRestart(t *testing.T) {
	dir := os.Getenv("KVTIER_PROF_DIR")
	if dir == "" {
		t.Skip()
	}
	n, _ := strconv.Atoi(os.Getenv("KVTIER_PROF_N"))
	runs, _ := strconv.Atoi(os.Getenv("KVTIER_PROF_RUNS"))
	prof := os.Getenv("KVTIER_PROF_OUT")
	os.MkdirAll(dir, 0o755)
	for r := range runs {
		t0 := time.Now()
		if err := fillChild(dir, n, 4095); err != nil {
			t.Fatal(err)
		}
		t.Logf("fill %v", time.Since(t0))
		for _, kind := range []string{"crash", "clean"} {
			dropCache(dir)
			var f *os.File
			if prof != "" {
				f, _ = os.Create(fmt.Sprintf("%s/%s-%d.pprof", prof, kind, r))
				pprof.StartCPUProfile(f)
			}
			la := loadAvg()
			cpu0 := cpuTime()
			d, err := disk.Open(dir, diskOptions())
			cpu := cpuTime() - cpu0
			if prof != "" {
				pprof.StopCPUProfile()
				f.Close()
			}
			if err != nil {
				t.Fatal(err)
			}
			rec := d.Recovered()
			warm := d.WaitPolicy()
			cpuW := cpuTime() - cpu0
			t.Logf("%s run %d: ready %v cpu %v | warm %v cpu %v | scanned %d fromckpt %d load %s", kind, r, rec.Duration, cpu, warm, cpuW, rec.Scanned, rec.FromCheckpoint, la)
			d.Close()
		}
	}
}
