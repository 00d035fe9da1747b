package overlaytest

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// KeepHostRoot runs a test binary's tests (m.Run) and returns their code,
// or 1 when the host gained an entry meanwhile in its root directory or in
// one of the node paths that containers and kubelets write (watchedHostPaths),
// naming it. A mkdir for a mountpoint in a private mount namespace still
// writes the host's disk (the empty /host-sys that Served once left
// behind), and a test that hands podman a CDI spec must put it in the
// host's /var/run/cdi; no test may leave anything outside its temporary
// directories. Main does this for its callers; a TestMain that does not use
// Main calls it itself.
func KeepHostRoot(run func() int) int {
	return keepHost(os.Stderr, append([]string{"/"}, watchedHostPaths()...), run)
}

// watchedHostPaths are the node paths, beside the root directory, that a
// test could write through a real consumer: the CDI spec directories
// podman and containerd read (podman 4.3 reads only these two, so its
// tests must write there), and the directories a kubelet creates whatever
// its --root-dir (kubetest keeps them in private tmpfs mounts).
func watchedHostPaths() []string {
	return []string{"/var/run/cdi", "/etc/cdi", "/var/lib/kubelet", "/var/log/pods", "/var/log/containers"}
}

// keepHost is KeepHostRoot for the given directories: each directory and
// every entry in it that did not exist before run and exists after fails
// the run, said on w.
func keepHost(w io.Writer, dirs []string, run func() int) int {
	before, err := hostEntries(dirs)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	code := run()
	after, err := hostEntries(dirs)
	if err != nil {
		fmt.Fprintln(w, err)
		return 1
	}
	if added := newEntries(before, after); len(added) > 0 {
		fmt.Fprintf(w, "FAIL: the tests left %q on the host: nothing may be created outside a temporary directory\n", added)
		return 1
	}
	return code
}

// HoldHostPaths is for a test that must write in one of the watched host
// paths (podman 4.3 reads CDI specs only from /etc/cdi and /var/run/cdi):
// it holds them until the test ends, so KeepHostRoot in a test binary
// running beside this one (go test runs packages in parallel) waits and
// never counts this test's entries. The test removes what it wrote in its
// own cleanups, registered after this call so that they run before the
// hold ends; its own binary's KeepHostRoot checks that it did.
func HoldHostPaths(t testing.TB) {
	t.Helper()
	unlock, err := lockHost(unix.LOCK_EX)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unlock)
}

// lockHost takes an advisory lock (flock) on the host's root directory:
// the one lock every test binary of this module agrees on, with nothing to
// create and nothing to leave.
func lockHost(how int) (func(), error) {
	f, err := os.Open("/")
	if err != nil {
		return nil, fmt.Errorf("open the host's root directory to lock it: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the host's root directory: %w", err)
	}
	return func() { f.Close() }, nil // closing the last descriptor releases the lock
}

// hostEntries lists each of dirs, if it exists, and its entries, as
// paths, under a shared hold of the host paths (HoldHostPaths).
func hostEntries(dirs []string) ([]string, error) {
	unlock, err := lockHost(unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer unlock()
	var paths []string
	for _, dir := range dirs {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list the host's %s: %w", dir, err)
		}
		paths = append(paths, dir)
		for _, e := range entries {
			paths = append(paths, filepath.Join(dir, e.Name()))
		}
	}
	return paths, nil
}

// newEntries returns the names in after that before lacks.
func newEntries(before, after []string) []string {
	var added []string
	for _, name := range after {
		if !slices.Contains(before, name) {
			added = append(added, name)
		}
	}
	return added
}
