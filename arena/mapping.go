package arena

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Backing says which pages back the mapping.
type Backing struct {
	// HugeTLB is true when the memfd came from the hugetlb pool.
	HugeTLB bool
	// THPAdvised is true when huge pages were asked for, hugetlb was not
	// available, and the ordinary mapping was marked MADV_HUGEPAGE instead.
	THPAdvised bool
	// ShmemTHP is the kernel's transparent-huge-page mode for shared memory
	// (/sys/kernel/mm/transparent_hugepage/shmem_enabled), which decides
	// whether MADV_HUGEPAGE has any effect: "advise", "always" and
	// "within_size" honour it, "never" and "deny" do not.
	ShmemTHP string
	// Fallback says why hugetlb pages were not used when they were asked
	// for; nil otherwise.
	Fallback error
}

// String describes the backing in one phrase, for logs and status pages.
func (b Backing) String() string {
	switch {
	case b.HugeTLB:
		return "hugetlb pages"
	case b.THPAdvised:
		return fmt.Sprintf("ordinary pages with MADV_HUGEPAGE (shmem THP mode %q)", b.ShmemTHP)
	default:
		return "ordinary pages"
	}
}

const (
	thpShmemPath       = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
	defaultHugePageLen = 2 << 20
)

// mapShared creates the memfd, sizes it and maps it shared read/write.
func mapShared(name string, capacity int64, hugePages bool) (mem []byte, fd int, b Backing, err error) {
	if hugePages {
		mem, fd, err = mapHugeTLB(name, capacity)
		if err == nil {
			return mem, fd, Backing{HugeTLB: true}, nil
		}
		b.Fallback = err
	}
	mem, fd, err = mapMemfd(name, capacity, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, b, err
	}
	if hugePages {
		b.ShmemTHP = shmemTHPMode()
		if err := unix.Madvise(mem, unix.MADV_HUGEPAGE); err != nil {
			b.Fallback = errors.Join(b.Fallback, fmt.Errorf("madvise(MADV_HUGEPAGE): %w", err))
		} else {
			b.THPAdvised = true
		}
	}
	return mem, fd, b, nil
}

func mapHugeTLB(name string, capacity int64) ([]byte, int, error) {
	size := hugePageLen()
	if capacity%size != 0 {
		return nil, -1, fmt.Errorf("hugetlb: capacity %d is not a multiple of the huge page size %d", capacity, size)
	}
	mem, fd, err := mapMemfd(name, capacity, unix.MFD_CLOEXEC|unix.MFD_HUGETLB|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, -1, fmt.Errorf("hugetlb: %w", err)
	}
	return mem, fd, nil
}

func mapMemfd(name string, capacity int64, flags int) ([]byte, int, error) {
	fd, err := unix.MemfdCreate(name, flags)
	if err != nil {
		return nil, -1, fmt.Errorf("memfd_create %q: %w", name, err)
	}
	if err := unix.Ftruncate(fd, capacity); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("ftruncate memfd to %d bytes: %w", capacity, err)
	}
	// The fd is handed to every local client. Unsealed, a client could
	// shrink the file under the daemon's mapping and the daemon's next
	// touch of the cut pages would be a SIGBUS; the seals make its
	// ftruncate fail with EPERM instead.
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("sealing memfd against resizing: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(capacity), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, -1, fmt.Errorf("mmap %d bytes of memfd: %w", capacity, err)
	}
	return mem, fd, nil
}

// prefault makes every page of mem resident now, so the first KV write does
// not pay for page faults. MADV_POPULATE_WRITE (Linux 5.14) does it in one
// call and reports a shortage of memory as an error; kernels that do not
// know it (EINVAL) get one written byte per page instead.
func prefault(mem []byte) error {
	err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE)
	if errors.Is(err, unix.EINVAL) {
		touchPages(mem, os.Getpagesize())
		return nil
	}
	if err != nil {
		return fmt.Errorf("prefault: madvise(MADV_POPULATE_WRITE): %w", err)
	}
	return nil
}

// touchPages writes a zero into every page. The mapping is fresh, so the
// bytes are zero already and the writes only force allocation.
func touchPages(mem []byte, pageLen int) {
	for i := 0; i < len(mem); i += pageLen {
		mem[i] = 0
	}
}

// hugePageLen reads the default huge page size from /proc/meminfo.
func hugePageLen() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return defaultHugePageLen
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, "Hugepagesize:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil || kb <= 0 {
			return defaultHugePageLen
		}
		return kb << 10
	}
	return defaultHugePageLen
}

// shmemTHPMode returns the bracketed choice of shmem_enabled, e.g. "never".
func shmemTHPMode() string {
	raw, err := os.ReadFile(thpShmemPath)
	if err != nil {
		return "unknown"
	}
	_, rest, ok := bytes.Cut(raw, []byte("["))
	if !ok {
		return "unknown"
	}
	mode, _, ok := bytes.Cut(rest, []byte("]"))
	if !ok {
		return "unknown"
	}
	return string(mode)
}
