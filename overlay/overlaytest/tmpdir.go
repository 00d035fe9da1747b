package overlaytest

import (
	"fmt"
	"os"
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

// Main runs a test binary's tests with their temporary files in memory, and
// returns m.Run's code. Rendering is creating thousands of small files and
// removing them again: on a virtual machine's ext4 that costs up to a
// millisecond of kernel time a file, and most of the suite's time goes to
// it; on a tmpfs, a twentieth of that. So when TMPDIR is unset and
// /dev/shm is a tmpfs with a GiB free, Main points TMPDIR at a directory
// there (t.TempDir, os.MkdirTemp and the go build of BuildBinary follow
// it) and removes it afterwards. Set TMPDIR to choose the disk: Main
// leaves it alone. What the tests check does not depend on the filesystem:
// the writer's renames and syncfs behave the same on both, and no test
// loses power. The reliability tests, whose readers race whole renders,
// do not use Main: they keep a node's timing.
func Main(m *testing.M) int {
	if _, set := os.LookupEnv("TMPDIR"); set || !roomInMemory() {
		return m.Run()
	}
	dir, err := os.MkdirTemp(memoryDir, "nvml-mock-sysfs-test-")
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
