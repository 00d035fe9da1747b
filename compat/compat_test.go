package compat_test

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest/rendered"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// trees holds the trees the tests only read, each rendered once.
var trees rendered.Trees

func TestMain(m *testing.M) {
	code := overlaytest.Main(m)
	trees.Close()
	os.Exit(code)
}

// shared returns the profile's tree, rendered once for every test that
// reads it: the caller must not change it.
func shared(t *testing.T, prof string) (string, *plan.Plan) {
	t.Helper()
	return trees.Render(t, overlay.Options{Profile: prof})
}

// cleanReports holds the report on each shared tree, run once: the tree
// does not change, and a run is seconds of CPU, most of it go-nvlib
// parsing pci.ids for every function of every scan.
var cleanReports reportCache

type reportCache struct {
	mu      sync.Mutex
	reports map[string]*onceReport
}

type onceReport struct {
	once   sync.Once
	report *compat.Report
}

// sharedReport is compat's report on the profile's shared tree; the
// caller must change neither.
func sharedReport(t *testing.T, prof string) (*compat.Report, string, *plan.Plan) {
	t.Helper()
	root, p := shared(t, prof)
	c := &cleanReports
	c.mu.Lock()
	if c.reports == nil {
		c.reports = map[string]*onceReport{}
	}
	r, ok := c.reports[root]
	if !ok {
		r = &onceReport{}
		c.reports[root] = r
	}
	c.mu.Unlock()
	r.once.Do(func() { r.report = compat.Run(p.Machine, filepath.Join(root, "sys")) })
	return r.report, root, p
}

// render writes a profile into a new root of the caller's own, to break.
// It skips syncfs: no test here is of durability.
func render(t *testing.T, prof string) (string, *plan.Plan) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "overlay")
	p, _, err := overlay.Render(overlay.Options{Profile: prof, Root: root, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	return root, p
}

func requireOK(t *testing.T, r *compat.Report) {
	t.Helper()
	for _, f := range r.Failures() {
		t.Errorf("%s %s: %s", f.Check, f.Device, f.Detail)
	}
	require.True(t, r.OK())
}

// rowCounts counts a report's rows by check.
func rowCounts(r *compat.Report) map[string]int {
	out := map[string]int{}
	for _, x := range r.Results {
		out[x.Check]++
	}
	return out
}

func TestHostSideEveryProfile(t *testing.T) {
	profiles := append(shipped.Names(), overlaytest.RepoProfiles(t)...)
	for _, prof := range profiles {
		t.Run(filepath.Base(prof), func(t *testing.T) {
			t.Parallel()
			checkHostSide(t, prof)
		})
	}
	// Only nvml-mock's own profiles need ../shared; without it this part
	// skips and the rest still runs.
	t.Run("shared", func(t *testing.T) {
		t.Parallel()
		profs, _ := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
		for _, prof := range profs {
			t.Run(filepath.Base(prof), func(t *testing.T) {
				t.Parallel()
				checkHostSide(t, prof)
			})
		}
	})
}

func checkHostSide(t *testing.T, prof string) {
	r, root, p := sharedReport(t, prof)
	requireOK(t, r)
	n := len(p.Machine.Devices)
	got := rowCounts(r)
	require.Equal(t, n, got[compat.PCIeRoot], "one pcieRoot row per endpoint")
	require.Equal(t, n, got[compat.NUMAScalar])
	require.Equal(t, n, got[compat.NUMAList])
	require.Equal(t, len(p.Machine.GPUs()), got[compat.GPUByBusID])
	require.Equal(t, len(p.Machine.GPUs()), got[compat.BARMemory])
	require.Equal(t, 1, got[compat.AllDevices])
	require.Equal(t, 1, got[compat.ReferencePlain])
	if hcas := p.Machine.HCAs; hcas != nil {
		require.Equal(t, len(p.Machine.GPUs())*hcas.PerGPU, got[compat.HCAPCIeRoot], "one pcieRoot row per HCA")
		require.Equal(t, 1, got[compat.HCAAllDevices])
		require.Equal(t, 1, got[compat.NetworkControllers])
	} else {
		require.Zero(t, got[compat.HCAPCIeRoot])
	}
	served := compat.CheckServedLinks(root, p.ContainerRoot)
	require.True(t, served.OK, served.Detail)
}

func TestNUMAMinusOneIsNotPublished(t *testing.T) {
	t.Parallel()
	r, _, _ := sharedReport(t, "t4-vm")
	requireOK(t, r)
	for _, x := range r.Results {
		if x.Check == compat.NUMAScalar {
			require.Equal(t, "not published (numa_node=-1)", x.Detail)
		}
	}
}

// The matrix must go red when the tree is wrong: each case breaks one
// thing a consumer relies on.
func TestFailuresAreCaught(t *testing.T) {
	tests := []struct {
		name   string
		break_ func(t *testing.T, root string, p *plan.Plan)
		check  string
		detail string
	}{
		{
			name: "plain escaped link loses pcieRoot",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				relink(t, root, p, "0000:53:00.0", func(n *plan.Node) string { return plan.EscapedTarget(p.ContainerRoot, n.SysPath()) })
			},
			check: compat.PCIeRoot, detail: "it must start with devices/pci",
		},
		{
			name: "unreadable vendor aborts go-nvlib's scan",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				require.NoError(t, os.Remove(filepath.Join(root, plan.LinksDir, "0000:50:01.0", "vendor")))
			},
			check: compat.AllDevices, detail: "unable to read PCI vendor",
		},
		{
			name:   "wrong class",
			break_: writeAttr("0000:64:00.0", "class", "0x030000\n"),
			check:  compat.GPUByBusID, detail: "class 0x30000, want 0x30200",
		},
		{
			name:   "wrong numa node",
			break_: writeAttr("0000:97:00.0", "numa_node", "0\n"),
			check:  compat.NUMAScalar, detail: "got 0, want 1",
		},
		{
			name:   "missing GPU",
			break_: removeEntry("0000:ca:00.0"),
			check:  compat.GPUs, detail: "got [",
		},
		{
			name: "BAR1 too small",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				f := filepath.Join(root, plan.LinksDir, "0000:75:00.0", "resource")
				data, err := os.ReadFile(f)
				require.NoError(t, err)
				lines := strings.Split(string(data), "\n")
				lines[2] = "0x0000200000000000 0x00002000000fffff 0x000000000014220c"
				require.NoError(t, os.WriteFile(f, []byte(strings.Join(lines, "\n")), 0o644))
			},
			check: compat.BARMemory, detail: "want",
		},
		{
			name: "an HCA's plain escaped link loses pcieRoot",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				relink(t, root, p, "0000:54:00.0", func(n *plan.Node) string { return plan.EscapedTarget(p.ContainerRoot, n.SysPath()) })
			},
			check: compat.HCAPCIeRoot, detail: "it must start with devices/pci",
		},
		{
			name: "an HCA linked under another root complex",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				// Lexically under pci0000:61, the next GPU's root complex.
				relink(t, root, p, "0000:54:00.0", func(n *plan.Node) string {
					return "0000:62:00.0/../../../../devices/pci0000:61/0000:61:01.0/0000:54:00.0"
				})
			},
			check: compat.HCAPCIeRoot, detail: "pci0000:61, its GPU 0000:53:00.0 pci0000:50",
		},
		{
			name:   "an InfiniBand HCA in Ethernet's class",
			break_: writeAttr("0000:65:00.0", "class", "0x020000\n"),
			check:  compat.NetworkControllers, detail: "lists HCAs [0000:65:00.0], want exactly the Ethernet-mode ones []",
		},
		{
			name:   "a missing HCA",
			break_: removeEntry("0000:76:00.0"),
			check:  compat.HCAAllDevices, detail: "missing 0000:76:00.0",
		},
		{
			name:   "an HCA with another device id",
			break_: writeAttr("0000:87:00.0", "device", "0x101b\n"),
			check:  compat.HCAAllDevices, detail: "0000:87:00.0: device 0x101b, want 0x1021",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			root, p := render(t, "hgx-h100")
			tt.break_(t, root, p)
			r := compat.Run(p.Machine, filepath.Join(root, "sys"))
			require.False(t, r.OK())
			var hit bool
			for _, f := range r.Failures() {
				if f.Check == tt.check && strings.Contains(f.Detail, tt.detail) {
					hit = true
				}
			}
			require.True(t, hit, "want a %s failure with %q, got %+v", tt.check, tt.detail, r.Failures())
		})
	}
}

// writeAttr breaks a tree by writing one attribute file of a device.
func writeAttr(bdf, name, value string) func(t *testing.T, root string, p *plan.Plan) {
	return func(t *testing.T, root string, _ *plan.Plan) {
		require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, bdf, name), []byte(value), 0o644))
	}
}

// removeEntry breaks a tree by removing a device's links-directory entry.
func removeEntry(bdf string) func(t *testing.T, root string, p *plan.Plan) {
	return func(t *testing.T, root string, _ *plan.Plan) {
		require.NoError(t, os.Remove(filepath.Join(root, plan.LinksDir, bdf)))
	}
}

func relink(t *testing.T, root string, p *plan.Plan, bdf string, target func(*plan.Node) string) {
	t.Helper()
	for _, n := range p.Tree.Nodes() {
		if n.Address.String() == bdf {
			link := filepath.Join(root, plan.LinksDir, bdf)
			require.NoError(t, os.Remove(link))
			require.NoError(t, os.Symlink(target(n), link))
			return
		}
	}
	t.Fatalf("no node %s", bdf)
}

func TestProfileMismatchIsCaught(t *testing.T) {
	t.Parallel()
	root, _ := shared(t, "hgx-h100")
	p, src, err := shipped.Load("dgx-a100")
	require.NoError(t, err)
	other, err := profile.Normalize(src, p, profile.Options{})
	require.NoError(t, err)
	r := compat.Run(other, filepath.Join(root, "sys"))
	require.False(t, r.OK())
	require.NotEmpty(t, r.Failures())
}

func TestFailedChecks(t *testing.T) {
	t.Parallel()
	r := &compat.Report{Results: []compat.Result{
		{Check: "b", OK: false}, {Check: "a", OK: true}, {Check: "c", OK: false}, {Check: "b", OK: false},
	}}
	require.Equal(t, []string{"b", "c"}, r.FailedChecks(), "each failed check once, in report order")
	require.Empty(t, (&compat.Report{Results: []compat.Result{{Check: "a", OK: true}}}).FailedChecks())
}

// TestHCALinkLayers renders the h100 built-in with its ConnectX-7s in each
// link layer: go-nvlib's GetNetworkControllers matches class 0x020000 only,
// so it lists all eight in Ethernet mode and none in InfiniBand mode.
func TestHCALinkLayers(t *testing.T) {
	for _, layer := range []string{"InfiniBand", "Ethernet"} {
		t.Run(layer, func(t *testing.T) {
			t.Parallel()
			p, ok := shipped.Get("hgx-h100")
			require.True(t, ok)
			p.InfiniBand.LinkLayer = layer
			data, err := profile.Marshal(p, "hgx-h100 with "+layer+" HCAs")
			require.NoError(t, err)
			file := filepath.Join(t.TempDir(), "h100-"+layer+".yaml")
			require.NoError(t, os.WriteFile(file, data, 0o644))
			root, pl := render(t, file)
			r := compat.Run(pl.Machine, filepath.Join(root, "sys"))
			requireOK(t, r)
			want := map[string]string{"InfiniBand": "exactly the 0 Ethernet-mode HCAs", "Ethernet": "exactly the 8 Ethernet-mode HCAs"}[layer]
			var got []string
			for _, x := range r.Results {
				if x.Check == compat.NetworkControllers || x.Check == compat.HCAAllDevices {
					got = append(got, x.Detail)
				}
			}
			require.Len(t, got, 2)
			require.Contains(t, got[1], want)
			require.Contains(t, got[0], "8 HCAs ConnectX-7 (15b3:1021)")
		})
	}
}

// TestHCAsAroundHostDevices renders h100 with --host-devices merge on a host
// that has a device on the bus the first HCA takes otherwise: the render
// moves that HCA, and compat, which finds the host's entries by their kernel
// link text, expects it where it went.
func TestHCAsAroundHostDevices(t *testing.T) {
	t.Parallel()
	host := t.TempDir()
	dev := filepath.Join(host, "devices/pci0000:00/0000:00:1c.0/0000:54:00.0")
	require.NoError(t, os.MkdirAll(dev, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dev, "vendor"), []byte("0x8086\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(host, sysfs.LinksDir), 0o755))
	require.NoError(t, os.Symlink("../../../devices/pci0000:00/0000:00:1c.0/0000:54:00.0", filepath.Join(host, sysfs.LinksDir, "0000:54:00.0")))
	root := filepath.Join(t.TempDir(), "overlay")
	p, _, err := overlay.Render(overlay.Options{Profile: "hgx-h100", Root: root, HostDevices: overlay.HostDevicesMerge, HostSysfs: host, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	require.NotEqual(t, "0000:54:00.0", p.Tree.HCAs[0].Node.Address.String(), "the HCA moved off the host's bus")
	requireOK(t, compat.Run(p.Machine, filepath.Join(root, "sys")))
}

// TestReportOfNoRowIsNoPass: a report with no row checked nothing, so it
// is not OK, though no row of it failed.
func TestReportOfNoRowIsNoPass(t *testing.T) {
	require.False(t, (&compat.Report{}).OK())
	require.Empty(t, (&compat.Report{}).Failures())
	require.True(t, (&compat.Report{Results: []compat.Result{{Check: "c", OK: true}}}).OK())
}
