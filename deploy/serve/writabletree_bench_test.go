package serve

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// BenchmarkWrite is one write to a driver's unbind or bind file of a large
// machine (hgx-h100: 8 GPUs, NVSwitches, HCAs): the kernel's answer, the
// state saved and the tree rendered again, without FUSE. The tree lives in
// TMPDIR: serve keeps it in memory (make bench sets no TMPDIR; the figures
// in docs/user/writable.md give both).
func BenchmarkWrite(b *testing.B) {
	tr := render(b, b.TempDir(), "hgx-h100")
	const g = "0000:53:00.0"
	for b.Loop() {
		require.Equal(b, syscall.Errno(0), tr.write(drv("nvidia", "unbind"), g))
		require.Equal(b, syscall.Errno(0), tr.write(drv("nvidia", "bind"), g))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/write")
}
