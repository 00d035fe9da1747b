package overlay_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// sizes are the machine sizes the issue asks to plan and render.
func sizes() []int { return []int{8, 72, 1024, 4096} }

func planFor(tb testing.TB, m *profile.Machine) *plan.Plan {
	p, err := plan.New(m, plan.Options{})
	require.NoError(tb, err)
	return p
}

func TestSyntheticProfilesPlan(t *testing.T) {
	for _, n := range sizes() {
		require.Len(t, planFor(t, overlaytest.SyntheticMachine(t, n)).Machine.GPUs(), n)
	}
}

// BenchmarkPlan is the pure part: profile to every path and content.
func BenchmarkPlan(b *testing.B) {
	for _, n := range sizes() {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var entries int
			for b.Loop() {
				m := overlaytest.SyntheticMachine(b, n)
				entries = len(planFor(b, m).Entries)
			}
			b.ReportMetric(float64(entries), "entries/op")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/gpu")
		})
	}
}

// BenchmarkRender plans and writes a fresh tree.
func BenchmarkRender(b *testing.B) {
	for _, n := range sizes() {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			dir := b.TempDir()
			var st writer.Stats
			i := 0
			for b.Loop() {
				i++
				root := filepath.Join(dir, fmt.Sprint(i))
				p := planFor(b, overlaytest.SyntheticMachine(b, n))
				var err error
				st, err = writer.Apply(root, p, writer.Options{})
				require.NoError(b, err)
				b.StopTimer()
				require.NoError(b, os.RemoveAll(root))
				b.StartTimer()
			}
			b.ReportMetric(float64(st.FilesWritten+st.LinksWritten), "written/op")
			b.ReportMetric(float64(st.BytesWritten), "bytes-written/op")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/gpu")
		})
	}
}

// BenchmarkRerenderUnchanged renders the same profile over its own tree:
// the no-op fast path. It writes nothing.
func BenchmarkRerenderUnchanged(b *testing.B) {
	for _, n := range []int{8, 72, 1024} {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			root := filepath.Join(b.TempDir(), "overlay")
			_, err := writer.Apply(root, planFor(b, overlaytest.SyntheticMachine(b, n)), writer.Options{})
			require.NoError(b, err)
			var st writer.Stats
			for b.Loop() {
				st, err = writer.Apply(root, planFor(b, overlaytest.SyntheticMachine(b, n)), writer.Options{})
				require.NoError(b, err)
			}
			require.Zero(b, st.Written())
			b.ReportMetric(float64(st.Written()), "written/op")
			b.ReportMetric(float64(st.FilesUnchanged+st.LinksUnchanged), "skipped/op")
			b.ReportMetric(float64(st.BytesUnchanged), "bytes-skipped/op")
		})
	}
}

// BenchmarkRerenderOneGPUChanged flips one GPU's subsystem id each time:
// only that GPU's files are rewritten.
func BenchmarkRerenderOneGPUChanged(b *testing.B) {
	for _, n := range []int{8, 72, 1024} {
		b.Run(fmt.Sprintf("gpus=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			root := filepath.Join(b.TempDir(), "overlay")
			variant := func(i int) *plan.Plan {
				p := overlaytest.SyntheticProfile(n)
				p.Devices[n/2].PCI.SubsystemID = profile.Pack(0x10de, uint16(0x1000+i%2))
				m, err := profile.Normalize("synthetic", p, profile.Options{})
				require.NoError(b, err)
				return planFor(b, m)
			}
			_, err := writer.Apply(root, variant(0), writer.Options{})
			require.NoError(b, err)
			var st writer.Stats
			i := 0
			for b.Loop() {
				i++
				st, err = writer.Apply(root, variant(i), writer.Options{})
				require.NoError(b, err)
			}
			b.ReportMetric(float64(st.Written()), "written/op")
			b.ReportMetric(float64(st.BytesWritten), "bytes-written/op")
			b.ReportMetric(float64(st.FilesUnchanged+st.LinksUnchanged), "skipped/op")
		})
	}
}
