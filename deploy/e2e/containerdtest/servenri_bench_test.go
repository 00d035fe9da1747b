package containerdtest_test

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

// BenchmarkServeNRI measures what serve --nri adds to a container's
// creation on the real containerd, and what it costs the node: CRI
// CreateContainer (through crictl, as a kubelet asks it) timed with no
// plugin and with serve --nri serving the container, in alternating
// rounds of one run; and serve's resident memory idle, once registered,
// and after 100 creations it served. The figures are b.ReportMetric's:
// the medians and 99th percentiles in ms, their differences, and the
// memory in MiB.
func BenchmarkServeNRI(b *testing.B) {
	h := containerdtest.Start(b, containerdtest.Options{})
	s := serve(b, h, unseenProfile)
	const rounds, perRound, served = 5, 20, 100
	var without, with []time.Duration
	var idle, after, peak int
	for b.Loop() {
		without, with = nil, nil
		for r := range rounds {
			without = append(without, creations(b, s, fmt.Sprintf("without-%d", r), perRound)...)
			n := s.startServeNRI(b, false)
			with = append(with, creations(b, s, fmt.Sprintf("with-%d", r), perRound)...)
			h.StopNRIPlugin(b, n.Plugin)
		}
		// The memory: registered and rendered, then after the creations.
		n := s.startServeNRI(b, false)
		podtest.Until(b, 30*time.Second, "serve's first sync", func() (bool, string) {
			return n.Metric(b, "nvml_mock_sysfs_syncs_total") > 0, n.Plugin.Log()
		})
		idle, _ = memory(b, n.Plugin.PID())
		creations(b, s, "memory", served)
		require.Equal(b, served, n.Metric(b, `nvml_mock_sysfs_nri_containers_total{result="served"}`))
		after, peak = memory(b, n.Plugin.PID())
		h.StopNRIPlugin(b, n.Plugin)
	}
	p50w, p99w := percentile(without, 50), percentile(without, 99)
	p50s, p99s := percentile(with, 50), percentile(with, 99)
	b.ReportMetric(ms(p50w), "ms-p50-without")
	b.ReportMetric(ms(p99w), "ms-p99-without")
	b.ReportMetric(ms(p50s), "ms-p50-with")
	b.ReportMetric(ms(p99s), "ms-p99-with")
	b.ReportMetric(ms(p50s-p50w), "ms-p50-added")
	b.ReportMetric(float64(idle)/1024, "MiB-rss-idle")
	b.ReportMetric(float64(after)/1024, "MiB-rss-after-served")
	b.ReportMetric(float64(peak)/1024, "MiB-rss-peak")
	b.Logf("FIGURES CreateContainer over %d creations each: without serve --nri p50 %s p99 %s; with it p50 %s p99 %s; serve's RSS idle %d KiB, after %d served creations %d KiB (peak %d KiB)",
		len(without), p50w.Round(time.Microsecond), p99w.Round(time.Microsecond), p50s.Round(time.Microsecond), p99s.Round(time.Microsecond), idle, served, after, peak)
}

// creations creates n containers in a new pod, one by one, timing each
// CreateContainer, and removes them.
func creations(b *testing.B, s *served, pod string, n int) []time.Duration {
	b.Helper()
	sandbox := s.h.RunPod(b, containerdtest.Pod{Name: "bench-" + pod})
	var took []time.Duration
	for i := range n {
		c := containerdtest.Container{Name: fmt.Sprintf("c%d", i), Image: containerdtest.PauseImage}
		began := time.Now()
		id, err := sandbox.Create(b, c)
		took = append(took, time.Since(began))
		require.NoError(b, err)
		s.h.Crictl(b, "rm", "--force", id)
	}
	return took
}

// memory is a process's resident set and its peak, in KiB.
func memory(b *testing.B, pid int) (rss, peak int) {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	require.NoError(b, err)
	for _, line := range strings.Split(string(status), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.Atoi(f[1])
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			peak = v
		}
	}
	return rss, peak
}

func percentile(d []time.Duration, p int) time.Duration {
	s := slices.Sorted(slices.Values(d))
	return s[(len(s)-1)*p/100]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
