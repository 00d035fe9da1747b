package hosttest

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"

	"golang.org/x/sys/unix"
)

// turnDir is the directory Alone locks: one every machine has, left as it
// was. Not "/", which HoldHostPaths locks for another purpose: a second
// lock on it from the same test binary would wait for the first.
const turnDir = "/etc"

// Alone runs a test binary's run (Main, or KeepHostRoot) for a suite that
// runs daemons or loads the machine for minutes (a Kubernetes node,
// containerd, the consumer matrix): it waits until no other such suite's
// test binary runs, from this checkout or another, so that make test can
// run every package at once (go test -p) while these take turns, as one
// node per machine needs (the API server's address is fixed). The turn is
// an advisory lock (flock) on turnDir.
func Alone(run func() int) int {
	f, err := os.Open(turnDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "overlaytest: open %s to take a turn: %v\n", turnDir, err)
		return 1
	}
	defer f.Close() // releases the lock
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		began := time.Now()
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
			fmt.Fprintf(os.Stderr, "overlaytest: lock %s: %v\n", turnDir, err)
			return 1
		}
		fmt.Fprintf(os.Stderr, "overlaytest: waited %s for another end-to-end suite to end\n", time.Since(began).Round(time.Second))
	}
	return run()
}

// MainAlone is Main for a suite that takes its turn (Alone).
func MainAlone(m *testing.M) int { return Alone(func() int { return overlaytest.Main(m) }) }
