package disk

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// RawDirectIO measures what the device under dir can do without the tier:
// it writes bufs back to back to a scratch file with O_DIRECT (then one
// fdatasync), reads the file back into the same buffers the same way,
// deletes it and returns both rates in bytes per second. It is the
// baseline that disk-tier benchmarks are reported against, measured in
// the same run because shared machines are noisy, and on the same memory
// as the tier's transfers because where the buffers sit moves O_DIRECT
// rates on virtual machines. A buffer O_DIRECT cannot use as it is
// (unaligned address or length) is staged through aligned memory.
func RawDirectIO(dir string, bufs [][]byte) (writeBps, readBps float64, err error) {
	if len(bufs) == 0 {
		return 0, 0, fmt.Errorf("disk: raw I/O needs at least one buffer")
	}
	io := make([][]byte, len(bufs))
	var total int64
	for i, b := range bufs {
		if len(b) == 0 {
			return 0, 0, fmt.Errorf("disk: raw I/O buffer %d is empty", i)
		}
		io[i] = b
		if !aligned(b) || len(b)%blockSize != 0 {
			io[i] = alignedBuf(int(alignUp(int64(len(b)))))
			copy(io[i], b)
		}
		total += int64(len(io[i]))
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

	start := time.Now()
	var off int64
	for _, b := range io {
		if err := pwritevFull(fd, [][]byte{b}, off); err != nil {
			return 0, 0, fmt.Errorf("disk: raw write: %w", err)
		}
		off += int64(len(b))
	}
	if err := unix.Fdatasync(fd); err != nil {
		return 0, 0, fmt.Errorf("disk: raw fdatasync: %w", err)
	}
	writeBps = float64(total) / time.Since(start).Seconds()

	start = time.Now()
	off = 0
	for _, b := range io {
		if err := preadFull(fd, b, off); err != nil {
			return 0, 0, fmt.Errorf("disk: raw read: %w", err)
		}
		off += int64(len(b))
	}
	readBps = float64(total) / time.Since(start).Seconds()
	return writeBps, readBps, nil
}
