package capture_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/capture"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func TestMain(m *testing.M) { os.Exit(overlaytest.Main(m)) }

// readBack is what go-nvlib reports of one GPU.
type readBack struct {
	BusID                            string
	Vendor, Device                   uint16
	SubsystemVendor, SubsystemDevice uint16
	Class                            uint32
	BAR1                             uint64
}

type quiet struct{}

func (quiet) Warningf(string, ...any) {}

// renderAndRead imports a capture, writes the profile as YAML, loads it back
// as any user's profile, renders it, and asks go-nvlib what it finds.
// With matrix set, it also runs the whole compat matrix of real consumers.
// go-nvlib parses pci.ids once per device it reads, so tests ask for the
// matrix once per capture, not under every option.
func renderAndRead(t *testing.T, xml string, opts capture.Options, matrix bool) []readBack {
	t.Helper()
	c, err := capture.ParseNvidiaSMI(strings.NewReader(xml), "capture.xml")
	require.NoError(t, err)
	res, err := c.Profile(opts)
	require.NoError(t, err)
	out, err := profile.Marshal(res.Profile, res.Header)
	require.NoError(t, err)
	p, err := profile.Parse("imported.yaml", out)
	require.NoError(t, err)
	m, err := profile.Normalize("imported.yaml", p, profile.Options{})
	require.NoError(t, err, string(out))
	root, _ := overlaytest.Render(t, m, plan.Options{})

	lib := nvpci.New(nvpci.WithPCIDevicesRoot(filepath.Join(root, plan.LinksDir)), nvpci.WithLogger(quiet{}))
	gpus, err := lib.GetGPUs()
	require.NoError(t, err)
	var got []readBack
	for _, g := range gpus {
		bar := 1
		if boards.BARLayoutOf("", g.Device) == boards.Hopper {
			bar = 2
		}
		r, ok := g.Resources[bar]
		require.True(t, ok, "%s has no BAR%d", g.Address, bar)
		got = append(got, readBack{
			BusID: g.Address, Vendor: g.Vendor, Device: g.Device,
			SubsystemVendor: g.SubsystemVendor, SubsystemDevice: g.SubsystemDevice,
			Class: g.Class, BAR1: uint64(r.End-r.Start) + 1,
		})
	}
	if matrix {
		report := compat.Run(m, filepath.Join(root, "sys"))
		require.True(t, report.OK(), "%v", report.Failures())
	}
	return got
}

// want is what go-nvlib must read back for a capture: its own facts, in the
// kernel's lower-case spelling.
func want(t *testing.T, xml string) []readBack {
	t.Helper()
	c, err := capture.ParseNvidiaSMI(strings.NewReader(xml), "capture.xml")
	require.NoError(t, err)
	var out []readBack
	for _, g := range c.GPUs {
		r := readBack{BusID: g.Address.String(), Vendor: g.Vendor, Device: g.Device, Class: 0x030200}
		require.NotNil(t, g.SubsystemVendor, "a real capture has a subsystem id")
		require.NotNil(t, g.BAR1Bytes, "a real capture has a BAR1 size")
		r.SubsystemVendor, r.SubsystemDevice = *g.SubsystemVendor, *g.SubsystemDevice
		if g.Class != nil {
			r.Class = *g.Class
		}
		r.BAR1 = *g.BAR1Bytes
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b readBack) int { return strings.Compare(a.BusID, b.BusID) })
	return out
}

// optionsUnder lists the import choices a capture is rendered under: the
// defaults first, then per-domain, then each forced hierarchy.
func optionsUnder() []capture.Options {
	out := []capture.Options{capture.DefaultOptions()}
	perDomain := capture.DefaultOptions()
	perDomain.RootComplexes = capture.PerDomain
	out = append(out, perDomain)
	for _, h := range boards.Hierarchies() {
		o := capture.DefaultOptions()
		o.Hierarchy = h
		out = append(out, o)
	}
	return out
}

func describe(o capture.Options) string {
	h := string(o.Hierarchy)
	if h == "" {
		h = "default"
	}
	return fmt.Sprintf("%s/%s", o.RootComplexes, h)
}

// TestRoundTripRealCaptures: every real capture in ../shared imports,
// renders and reads back through go-nvlib with exactly its bus ids, ids,
// class and BAR1 size, under every inference and hierarchy.
func TestRoundTripRealCaptures(t *testing.T) {
	// Two GPUs at a real HGX H100 node's bus numbers always run; the real
	// captures need ../shared, and only that subtest skips without it.
	roundTripUnderEveryOption(t, "in-repo/hgx-h100", synthCapture(
		gpu("00000000:18:00.0", "233010DE", "16C110DE", "131072 MiB"),
		gpu("00000000:2A:00.0", "233010DE", "16C110DE", "131072 MiB")))
	t.Run("shared", func(t *testing.T) {
		t.Parallel()
		dir := overlaytest.SharedTestdata(t, "nvidia-smi-captures")
		files, err := filepath.Glob(filepath.Join(dir, "*.xml"))
		require.NoError(t, err)
		require.NotEmpty(t, files)
		for _, f := range files {
			data, err := os.ReadFile(f)
			require.NoError(t, err)
			roundTripUnderEveryOption(t, filepath.Base(f), string(data))
		}
	})
}

func roundTripUnderEveryOption(t *testing.T, name, xml string) {
	for i, o := range optionsUnder() {
		t.Run(name+"/"+describe(o), func(t *testing.T) {
			t.Parallel()
			if _, err := mustProfile(t, xml, o); err != nil {
				// Only a VM capture refuses a non-flat hierarchy.
				require.ErrorContains(t, err, "only the flat hierarchy puts a GPU")
				return
			}
			got := renderAndRead(t, xml, o, i == 0)
			require.Equal(t, want(t, xml), got)
		})
	}
}

func mustProfile(t *testing.T, xml string, o capture.Options) (*capture.Result, error) {
	t.Helper()
	c, err := capture.ParseNvidiaSMI(strings.NewReader(xml), "capture.xml")
	require.NoError(t, err)
	return c.Profile(o)
}

// TestRoundTripSyntheticCaptures covers what the four real captures do not:
// other domains, 8-digit and lower-case ids, several GPUs on one bus, tight
// bus numbers, VGA class, N/A and missing fields, and the older format.
func TestRoundTripSyntheticCaptures(t *testing.T) {
	gpus := func(device, subsystem, bar1 string, busIDs ...string) []synthGPU {
		var out []synthGPU
		for _, b := range busIDs {
			out = append(out, gpu(b, device, subsystem, bar1))
		}
		return out
	}
	each := func(gs []synthGPU, f func(g *synthGPU)) []synthGPU {
		for i := range gs {
			f(&gs[i])
		}
		return gs
	}
	var many []string
	for bus := 0x1a; bus < 0x24; bus++ {
		many = append(many, fmt.Sprintf("0000:%02x:00.0", bus))
	}
	tests := []struct {
		name string
		gpus []synthGPU
		// Overrides of the read-back where the capture says N/A.
		subsystem *[2]uint16
		bar1      uint64
	}{
		{name: "AWS p4d: two A100s per bus, device 1c and 1d", gpus: gpus("20B010DE", "134F10DE", "65536 MiB",
			"00000000:10:1C.0", "00000000:10:1D.0", "00000000:20:1C.0", "00000000:20:1D.0",
			"00000000:90:1C.0", "00000000:90:1D.0", "00000000:A0:1C.0", "00000000:A0:1D.0")},
		{name: "Azure: a domain per GPU, on the root bus", gpus: gpus("20B510DE", "153310DE", "131072 MiB",
			"00000001:00:00.0", "00000002:00:00.0", "00000003:00:00.0", "00000004:00:00.0")},
		{name: "GCP: VGA class on the root bus", gpus: each(gpus("27B810DE", "16CA10DE", "32768 MiB",
			"00000000:00:03.0", "00000000:00:04.0"), func(g *synthGPU) { g.subClass = "0" })},
		{name: "ten GPUs on consecutive buses, lower case", gpus: gpus("233010de", "16c110de", "131072 MiB", many...)},
		{name: "a GPU on bus 01", gpus: gpus("233510DE", "18BE10DE", "131072 MiB", "00000000:01:00.0")},
		{name: "domains past 0 in 8-digit form", gpus: gpus("294110DE", "204610DE", "262144 MiB",
			"00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0")},
		{name: "older nvidia-smi: 0x ids, no class", gpus: each(gpus("0x1DB510DE", "0x124910DE", "32768 MiB",
			"0000:1A:00.0", "0000:1C:00.0", "0000:88:00.0", "0000:8A:00.0"), func(g *synthGPU) { g.baseClass, g.subClass = "", "" })},
		{name: "N/A subsystem, link and BAR1", gpus: each(gpus("20F110DE", "N/A", "N/A", "00000000:3B:00.0", "00000000:D8:00.0"),
			func(g *synthGPU) { g.maxGen, g.curGen, g.maxWidth, g.curWidth = "N/A", "N/A", "N/A", "N/A" }),
			subsystem: &[2]uint16{0x10de, 0x20f1}, bar1: 256 << 20},
		{name: "no BAR1 element on a board with a known BAR1", gpus: each(gpus("233010DE", "16C110DE", "", "00000000:18:00.0"),
			func(g *synthGPU) { g.noBAR1 = true }), bar1: 128 << 30},
	}
	for _, tc := range tests {
		xml := synthCapture(tc.gpus...)
		// The default import only: the inference table covers the other
		// choices, and the real captures render under all of them.
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := renderAndRead(t, xml, capture.DefaultOptions(), true)
			require.Equal(t, wantSynthetic(t, xml, tc.subsystem, tc.bar1), got)
		})
	}
}

// wantSynthetic is want with the profile's defaults for what the capture
// leaves out: subsystem = the GPU itself, BAR1 = the board's or 256 MiB.
func wantSynthetic(t *testing.T, xml string, subsystem *[2]uint16, bar1 uint64) []readBack {
	t.Helper()
	c, err := capture.ParseNvidiaSMI(strings.NewReader(xml), "capture.xml")
	require.NoError(t, err)
	var out []readBack
	for _, g := range c.GPUs {
		r := readBack{BusID: g.Address.String(), Vendor: g.Vendor, Device: g.Device, Class: 0x030200, BAR1: bar1}
		if g.SubsystemVendor != nil {
			r.SubsystemVendor, r.SubsystemDevice = *g.SubsystemVendor, *g.SubsystemDevice
		} else {
			r.SubsystemVendor, r.SubsystemDevice = subsystem[0], subsystem[1]
		}
		if g.Class != nil {
			r.Class = *g.Class
		}
		if g.BAR1Bytes != nil {
			r.BAR1 = *g.BAR1Bytes
		}
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b readBack) int { return strings.Compare(a.BusID, b.BusID) })
	return out
}
