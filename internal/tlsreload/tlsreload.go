// Package tlsreload serves a TLS certificate read from a cert and a key
// file and picks up new files without a restart: on Reload (the daemons
// call it on SIGHUP) and when either file's size or modification time
// changes, noticed at most once per CheckEvery during handshakes. A new
// pair that does not load (a half-written file, a key that does not match)
// keeps the old certificate serving and is logged, rate-limited; the next
// change or Reload tries again.
package tlsreload

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"kvtier/internal/ratelog"
)

// CheckEvery is how often handshakes look at the files: two small reads
// a second at most, whatever the handshake rate.
const CheckEvery = time.Second

// Reloader holds the certificate of one listener. Safe for concurrent use.
type Reloader struct {
	certPath, keyPath string
	log               *slog.Logger
	failed            *ratelog.Limiter

	cert      atomic.Pointer[tls.Certificate]
	nextCheck atomic.Int64 // unix nanoseconds before which handshakes do not read the files

	mu    sync.Mutex // serializes loads
	stamp [2]fileStamp
}

// fileStamp is what a change is detected by: a digest of the file's
// contents. Size and modification time are not enough: a renewed pair
// written within one tick of the filesystem's timestamp clock, with a
// certificate of the same length, would look unchanged. Reading two small
// files once per CheckEvery costs next to nothing.
type fileStamp [sha256.Size]byte

// New loads the pair, which must be valid: a listener does not start on a
// certificate it cannot serve. name (e.g. "admin_tls_cert") prefixes errors
// and log lines.
func New(name, certPath, keyPath string, log *slog.Logger) (*Reloader, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("cert", name)
	r := &Reloader{certPath: certPath, keyPath: keyPath, log: log,
		failed: ratelog.New(log, slog.LevelError, "new TLS certificate not loaded; the previous one keeps serving", time.Minute)}
	if err := r.load(); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return r, nil
}

// Config returns a server configuration whose certificate is the
// reloader's current one.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{GetCertificate: r.GetCertificate, MinVersion: tls.VersionTLS12}
}

// GetCertificate is tls.Config's hook: the current certificate, reloaded
// first if the files changed since the last look.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	now := time.Now().UnixNano()
	if next := r.nextCheck.Load(); now >= next && r.nextCheck.CompareAndSwap(next, now+int64(CheckEvery)) {
		if r.changed() {
			r.Reload()
		}
	}
	return r.cert.Load(), nil
}

// Reload reads the files again. On failure the previous certificate
// stays and the error is logged and returned.
func (r *Reloader) Reload() error {
	if err := r.load(); err != nil {
		r.failed.Log("err", err)
		return err
	}
	return nil
}

// Failures returns how many reloads failed since New.
func (r *Reloader) Failures() uint64 { return r.failed.Count() }

func (r *Reloader) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The stamp is taken before reading, so a write during the read is
	// seen as a change; a pair that fails is not tried again until then.
	r.stamp = r.stat()
	cert, err := tls.LoadX509KeyPair(r.certPath, r.keyPath)
	if err != nil {
		return err
	}
	old := r.cert.Swap(&cert)
	if old != nil {
		r.log.Info("TLS certificate reloaded", "file", r.certPath)
	}
	return nil
}

// changed reports whether either file differs from the pair last loaded
// (or last tried: a bad pair is not retried until it changes again).
func (r *Reloader) changed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.stat()
	if now == r.stamp {
		return false
	}
	r.stamp = now
	return true
}

// stat reads both files' stamps.
func (r *Reloader) stat() [2]fileStamp {
	var s [2]fileStamp
	for i, p := range []string{r.certPath, r.keyPath} {
		if data, err := os.ReadFile(p); err == nil {
			s[i] = sha256.Sum256(data)
		}
	}
	return s
}

// OnSIGHUP reloads every reloader in rs on each SIGHUP until the returned
// function is called. Without it a SIGHUP would end the process.
func OnSIGHUP(rs ...*Reloader) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-ch:
				for _, r := range rs {
					if r != nil {
						r.Reload()
					}
				}
			case <-done:
				return
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
		})
	}
}
