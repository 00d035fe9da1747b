package compat_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// BenchmarkCompat runs the consumer matrix on an 8-GPU tree. go-nvlib
// parses pci.ids once per NVIDIA function it reads, on every scan; that
// is most of the time, and GFD pays it too.
func BenchmarkCompat(b *testing.B) {
	m := overlaytest.SyntheticMachine(b, 8)
	root, _ := overlaytest.Render(b, m, plan.Options{})
	b.ReportAllocs()
	var rows int
	for b.Loop() {
		r := compat.Run(m, filepath.Join(root, "sys"))
		require.True(b, r.OK())
		rows = len(r.Results)
	}
	b.ReportMetric(float64(rows), "checks/op")
}
