package containerdtest_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

// BenchmarkServeNRI measures what serve --nri adds to a container's
// creation on the real containerd, and what it costs the node: CRI
// CreateContainer and StartContainer (through crictl, as a kubelet asks
// them) timed with no plugin, with serve --nri serving the container,
// with serve --nri --proc-hook-binary (its mounts and the /proc hook,
// which runc runs at StartContainer), and, where supplied, with
// nvml-mock-nri and with containerd/nri's device-injector giving the
// container the same mounts, in alternating rounds of one run; and
// serve's resident memory idle, once registered, and after 100 creations
// it served. The figures are b.ReportMetric's: the medians and 99th
// percentiles in ms per variant over all loops, serve's additions, and
// the memory in MiB (of the last loop).
func BenchmarkServeNRI(b *testing.B) {
	h := containerdtest.Start(b, containerdtest.Options{})
	s := serve(b, h, unseenProfile)
	const rounds, perRound, served = 5, 20, 100
	variants := benchVariants(b, s)
	var idle, after, peak int
	// Each of b.N loops adds rounds to the same samples: -benchtime 4x
	// times 400 creations of each variant, for medians that a few slow
	// creations on shared cores do not move.
	for i := 0; b.Loop(); i++ {
		for r := i * rounds; r < (i+1)*rounds; r++ {
			for _, v := range variants {
				annotations, stop := v.serve(b)
				create, start := creations(b, s, fmt.Sprintf("%s-%d", v.name, r), perRound, annotations)
				v.create, v.start = append(v.create, create...), append(v.start, start...)
				stop()
			}
		}
		// The memory: registered and rendered, then after the creations.
		n := s.startServeNRI(b, false)
		podtest.Until(b, 30*time.Second, "serve's first sync", func() (bool, string) {
			return n.Metric(b, "nvml_mock_sysfs_syncs_total") > 0, n.Plugin.Log()
		})
		idle, _ = memory(b, n.Plugin.PID())
		creations(b, s, "memory", served, nil)
		require.Equal(b, served, n.Metric(b, `nvml_mock_sysfs_nri_containers_total{result="served"}`))
		after, peak = memory(b, n.Plugin.PID())
		h.StopNRIPlugin(b, n.Plugin)
	}
	without := variants[0]
	for _, v := range variants {
		for _, timed := range []struct {
			call  string
			took  []time.Duration
			since []time.Duration
		}{{"", v.create, without.create}, {"start-", v.start, without.start}} {
			b.ReportMetric(ms(percentile(timed.took, 50)), "ms-"+timed.call+"p50-"+v.name)
			b.ReportMetric(ms(percentile(timed.took, 99)), "ms-"+timed.call+"p99-"+v.name)
			if v != without {
				b.ReportMetric(ms(percentile(timed.took, 50)-percentile(timed.since, 50)), "ms-"+timed.call+"p50-added-"+v.name)
			}
		}
		b.Logf("FIGURES %s over %d creations: CreateContainer p50 %s p99 %s; StartContainer p50 %s p99 %s", v.name, len(v.create),
			percentile(v.create, 50).Round(time.Microsecond), percentile(v.create, 99).Round(time.Microsecond),
			percentile(v.start, 50).Round(time.Microsecond), percentile(v.start, 99).Round(time.Microsecond))
	}
	b.ReportMetric(float64(idle)/1024, "MiB-rss-idle")
	b.ReportMetric(float64(after)/1024, "MiB-rss-after-served")
	b.ReportMetric(float64(peak)/1024, "MiB-rss-peak")
	b.Logf("FIGURES serve's RSS idle %d KiB, after %d served creations %d KiB (peak %d KiB)", idle, served, after, peak)
}

// benchVariant is one of BenchmarkServeNRI's ways to create a container,
// and what it measured.
type benchVariant struct {
	// name is the metrics' suffix.
	name string
	// serve connects the variant's plugin, if any, and returns the
	// annotations its pods carry and how to disconnect it.
	serve func(b *testing.B) (map[string]string, func())
	// create and start are CreateContainer's and StartContainer's times.
	create, start []time.Duration
}

// benchVariants are no plugin (first, the baseline), serve --nri without
// and with the /proc hook, and the supplied plugins: nvml-mock-nri with
// its devices annotation, the device-injector with the mounts annotation
// naming serve's mount set.
func benchVariants(b *testing.B, s *served) []*benchVariant {
	none := func(*testing.B) (map[string]string, func()) { return nil, func() {} }
	serveNRI := func(flags ...string) func(*testing.B) (map[string]string, func()) {
		return func(b *testing.B) (map[string]string, func()) {
			n := s.startServeNRI(b, false, flags...)
			return nil, func() { s.h.StopNRIPlugin(b, n.Plugin) }
		}
	}
	variants := []*benchVariant{
		{name: "without", serve: none},
		{name: "with", serve: serveNRI()},
		{name: "with-hook", serve: serveNRI("--proc-hook-binary", filepath.Join(b.TempDir(), "nvml-mock-sysfs"))},
	}
	if bin, ok := programs.NeedSupplied(b, programs.NvmlMockNRI); ok {
		variants = append(variants, &benchVariant{name: "nvml-mock-nri", serve: func(b *testing.B) (map[string]string, func()) {
			p := s.startNvmlMockNRI(b, bin)
			return map[string]string{"nvml-mock.nvidia.com/devices": "true"}, func() { s.h.StopNRIPlugin(b, p) }
		}})
	} else {
		b.Logf("FIGURES nvml-mock-nri: %s%s is not supplied", programs.NotRunPrefix, programs.NvmlMockNRI)
	}
	if _, ok := programs.NeedSupplied(b, programs.DeviceInjector); ok {
		mounts := s.cli(b, "mounts", "--root", s.root, "--format", "json", "--also-at", "/host-sys/bus/pci/devices")
		variants = append(variants, &benchVariant{name: "device-injector", serve: func(b *testing.B) (map[string]string, func()) {
			p, _ := s.h.StartDeviceInjector(b)
			annotations := map[string]string{}
			for i := range 100 {
				annotations[fmt.Sprintf("mounts.noderesource.dev/container.c%d", i)] = mounts
			}
			return annotations, func() { s.h.StopNRIPlugin(b, p) }
		}})
	} else {
		b.Logf("FIGURES device-injector: %s%s is not supplied", programs.NotRunPrefix, programs.DeviceInjector)
	}
	return variants
}

// creations creates and starts n containers in a new pod with
// annotations, one by one, timing each CreateContainer and
// StartContainer, and removes them.
func creations(b *testing.B, s *served, pod string, n int, annotations map[string]string) (create, start []time.Duration) {
	b.Helper()
	sandbox := s.h.RunPod(b, containerdtest.Pod{Name: "bench-" + pod, Annotations: annotations})
	for i := range n {
		c := containerdtest.Container{Name: fmt.Sprintf("c%d", i), Image: containerdtest.PauseImage}
		began := time.Now()
		id, err := sandbox.Create(b, c)
		create = append(create, time.Since(began))
		require.NoError(b, err)
		began = time.Now()
		s.h.Crictl(b, "start", id)
		start = append(start, time.Since(began))
		s.h.Crictl(b, "rm", "--force", id)
	}
	return create, start
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
