package overlaytest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Alone runs a test binary's run (Main, or KeepHostRoot) for a suite that
// runs daemons or loads the machine for minutes (a Kubernetes node, containerd, the consumer matrix): it waits
// until no other such suite's test binary runs, so make test can run every
// package at once (go test -p) while these take turns, as one node per
// machine needs (the API server's address is fixed). The turn is an
// advisory lock (flock) on the end-to-end wing's directory, which exists
// in every checkout and is left as it was.
func Alone(run func() int) int {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		fmt.Fprintln(os.Stderr, "overlaytest: cannot locate the end-to-end wing to take a turn")
		return 1
	}
	wing := filepath.Join(filepath.Dir(file), "..")
	f, err := os.Open(wing)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlaytest: open %s to take a turn: %v\n", wing, err)
		return 1
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		began := time.Now()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			fmt.Fprintf(os.Stderr, "overlaytest: lock %s: %v\n", wing, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "overlaytest: waited %s for another end-to-end suite to end\n", time.Since(began).Round(time.Second))
	}
	return run()
}

// MainAlone is Main for a suite that takes its turn (Alone).
func MainAlone(m *testing.M) int { return Alone(func() int { return Main(m) }) }
