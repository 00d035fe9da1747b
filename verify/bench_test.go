package verify_test

import (
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// BenchmarkVerify runs every check of verify on an 8-GPU tree seen from
// the host, with the live system's statfs, mount table and interfaces.
// The isolation and mount checks fail there, as they should outside a
// container; the work is the same.
func BenchmarkVerify(b *testing.B) {
	m := overlaytest.SyntheticMachine(b, 8)
	root, _ := overlaytest.Render(b, m, plan.Options{})
	sys := verify.Live(filepath.Join(root, "sys"), root)
	b.ReportAllocs()
	var rows int
	for b.Loop() {
		rows = len(verify.Run(m, sys).Results)
	}
	b.ReportMetric(float64(rows), "checks/op")
}
