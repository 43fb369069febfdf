package disk

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// RawDirectIO measures what the device under dir can do without the tier:
// it writes buf rounds times back to back to a scratch file with O_DIRECT
// (then one fdatasync), reads it all back the same way, deletes the file and
// returns both rates in bytes per second. It is the baseline that disk-tier
// benchmarks are reported against, measured in the same run because shared
// machines are noisy. buf is copied into aligned memory if O_DIRECT cannot
// use it as it is.
func RawDirectIO(dir string, buf []byte, rounds int) (writeBps, readBps float64, err error) {
	if rounds <= 0 || len(buf) == 0 {
		return 0, 0, fmt.Errorf("disk: raw I/O needs a buffer and at least one round")
	}
	if !aligned(buf) || len(buf)%blockSize != 0 {
		b := alignedBuf(int(alignUp(int64(len(buf)))))
		copy(b, buf)
		buf = b
	}
	f, err := os.CreateTemp(dir, ".rawio-*")
	if err != nil {
		return 0, 0, fmt.Errorf("disk: raw I/O scratch file: %w", err)
	}
	path := f.Name()
	f.Close()
	defer os.Remove(path)
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("disk: open %s with O_DIRECT: %w", path, err)
	}
	defer unix.Close(fd)
	total := float64(len(buf)) * float64(rounds)

	start := time.Now()
	for i := range rounds {
		if err := pwritevFull(fd, [][]byte{buf}, int64(i)*int64(len(buf))); err != nil {
			return 0, 0, fmt.Errorf("disk: raw write: %w", err)
		}
	}
	if err := unix.Fdatasync(fd); err != nil {
		return 0, 0, fmt.Errorf("disk: raw fdatasync: %w", err)
	}
	writeBps = total / time.Since(start).Seconds()

	start = time.Now()
	for i := range rounds {
		if err := preadFull(fd, buf, int64(i)*int64(len(buf))); err != nil {
			return 0, 0, fmt.Errorf("disk: raw read: %w", err)
		}
	}
	readBps = total / time.Since(start).Seconds()
	return writeBps, readBps, nil
}
