package serve

import (
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// FuzzWrite writes anything to any attribute, twice. Every answer is one
// of the kernel's errnos; nothing lands outside the root; and the state
// written reloads into the very tree the writes left, as a restart does.
func FuzzWrite(f *testing.F) {
	attrs := []string{
		dev(gpu, "driver_override"), drv("vfio-pci", "bind"), drv("nvidia", "unbind"), drv("vfio-pci", "unbind"),
		drv("nvidia", "bind"), drv("mlx5_core", "bind"), drv("mlx5_core", "unbind"), "sys/bus/pci/drivers_probe",
		dev(pf, "sriov_numvfs"), dev(pf, "driver_override"), dev("0000:19:00.1", "driver_override"),
	}
	f.Add(uint8(0), []byte("vfio-pci\n"), uint8(2), []byte(gpu))
	f.Add(uint8(8), []byte("4"), uint8(4), []byte("0000:19:00.1\n"))
	f.Add(uint8(8), []byte("8"), uint8(8), []byte("0"))
	f.Add(uint8(1), []byte("0000:18:00.0"), uint8(9), []byte("vfio-pci"))
	f.Add(uint8(200), []byte("../../etc/passwd"), uint8(7), []byte("0000:19:00.0"))
	known := []syscall.Errno{0, syscall.ENODEV, syscall.EBUSY, syscall.EINVAL, syscall.ERANGE, syscall.ENOENT, syscall.EACCES, syscall.ENOSPC}
	f.Fuzz(func(t *testing.T, a1 uint8, d1 []byte, a2 uint8, d2 []byte) {
		base := memTempDir(t)
		root := filepath.Join(base, "root")
		tr := render(t, root, sriovProfile)
		for _, w := range []struct {
			attr uint8
			data []byte
		}{{a1, d1}, {a2, d2}} {
			rel := string(w.data) // an arbitrary path too, past the attributes
			if int(w.attr) < len(attrs) {
				// A VF's attribute is written where the kernel would
				// look: unresolved while its VF does not exist.
				rel = attrs[w.attr]
				if r, err := tr.resolved(rel); err == nil {
					rel = r
				}
			}
			_, errno := tr.c.Write(rel, w.data)
			require.True(t, slices.Contains(known, errno), "write %q to %s: errno %v", w.data, rel, errno)
		}
		ents, err := os.ReadDir(base)
		require.NoError(t, err)
		require.Len(t, ents, 1, "only the root in its parent")
		again := render(t, root, sriovProfile)
		require.Equal(t, tr.c.Plan().Digest(), again.c.Plan().Digest(), "the state reloads into the same tree")
	})
}

// memTempDir is a temporary directory in memory where the machine has
// /dev/shm: creating a tree's files on this CI machine's disk takes a
// millisecond each, which would leave the fuzzer a few runs a second.
func memTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "writable-fuzz-")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
