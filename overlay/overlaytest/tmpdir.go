package overlaytest

import (
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// memoryDir is where Main puts the tests' temporary files when it can: a
// tmpfs on every Linux with systemd or Docker, though Docker's is 64 MiB.
const memoryDir = "/dev/shm"

// memoryFree is the room Main asks of memoryDir. The largest test binaries
// here hold a few rendered trees and one build of the binary at a time,
// well under it; Docker's 64 MiB default is too little, and so not used.
const memoryFree = 1 << 30

// memoryPrefix names Main's directory in memoryDir.
const memoryPrefix = "nvml-mock-sysfs-test-"

// TestGCPercent is the GOGC of test binaries, and of their children
// (Reexec), unless GOGC is set. go-nvlib parses the whole pci.ids for
// every device it builds, about 300 MB of garbage per compat run of an
// 8-GPU tree; at the default GOGC a fifth of that run goes to collecting
// it. A test binary has the memory to collect four times less often. The
// product binary the tests run keeps its own.
const TestGCPercent = 400

// Main runs a test binary's tests with their temporary files in memory and
// less frequent garbage collection, and returns m.Run's code. Rendering is
// creating thousands of small files and removing them again: on a virtual
// machine's ext4 that costs up to a millisecond of kernel time a file, and
// most of the suite's time goes to it; on a tmpfs, a twentieth of that. So when TMPDIR is unset and
// /dev/shm is a tmpfs with a GiB free, Main points TMPDIR at a directory
// there (t.TempDir, os.MkdirTemp and the go build of BuildBinary follow
// it) and removes it afterwards. Set TMPDIR to choose the disk: Main
// leaves it alone. What the tests check does not depend on the filesystem:
// the writer's renames and syncfs behave the same on both, and no test
// loses power. DiskTempDir is for paths that may not lie under /dev.
// Main also fails the run when the tests left anything in the host's root
// directory (KeepHostRoot).
func Main(m *testing.M) int {
	return KeepHostRoot(func() int { return runInMemory(m) })
}

// runInMemory is Main without the check of the host's root.
func runInMemory(m *testing.M) int {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(TestGCPercent)
	}
	if _, set := os.LookupEnv("TMPDIR"); set || !roomInMemory() {
		return m.Run()
	}
	dir, err := os.MkdirTemp(memoryDir, memoryPrefix)
	if err != nil {
		return m.Run()
	}
	if err := os.Setenv("TMPDIR", dir); err != nil {
		fmt.Fprintf(os.Stderr, "set TMPDIR: %v\n", err)
		return 1
	}
	code := m.Run()
	if err := os.RemoveAll(dir); err != nil {
		fmt.Fprintf(os.Stderr, "remove the temporary directory: %v\n", err)
	}
	return code
}

// roomInMemory reports whether memoryDir is a tmpfs with memoryFree free.
func roomInMemory() bool {
	var st unix.Statfs_t
	if err := unix.Statfs(memoryDir, &st); err != nil {
		return false
	}
	return st.Type == unix.TMPFS_MAGIC && st.Bavail*uint64(st.Bsize) >= memoryFree
}

// DiskTempDir is t.TempDir on the disk even when Main moved the temporary
// files to memory: for a path that may not lie under /dev, such as a
// container root.
func DiskTempDir(t testing.TB) string {
	t.Helper()
	base := os.TempDir()
	if strings.HasPrefix(base, memoryDir+"/"+memoryPrefix) {
		// Main's directory: TMPDIR was unset, and os.TempDir's default
		// on Linux is /tmp.
		base = "/tmp"
	}
	dir, err := os.MkdirTemp(base, "nvml-mock-sysfs-disk-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return dir
}
