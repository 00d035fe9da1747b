package compat_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

func render(t *testing.T, prof string) (string, *plan.Plan) {
	t.Helper()
	root := filepath.Join(t.TempDir(), "overlay")
	p, _, err := overlay.Render(overlay.Options{Profile: prof, Root: root})
	require.NoError(t, err)
	return root, p
}

func requireOK(t *testing.T, r *compat.Report) {
	t.Helper()
	for _, f := range r.Failures() {
		t.Errorf("%s %s: %s", f.Consumer, f.Device, f.Detail)
	}
	require.True(t, r.OK())
}

// rows counts a report's rows by consumer.
func rowCounts(r *compat.Report) map[string]int {
	out := map[string]int{}
	for _, x := range r.Results {
		out[x.Consumer]++
	}
	return out
}

func TestHostSideEveryProfile(t *testing.T) {
	profiles := append(builtin.Names(), "../testdata/profiles/domains.yaml", "../testdata/profiles/tight.yaml", "../testdata/profiles/no-topology.yaml", "../testdata/profiles/nvl72.yaml")
	shared, _ := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	profiles = append(profiles, shared...)
	for _, prof := range profiles {
		t.Run(filepath.Base(prof), func(t *testing.T) {
			root, p := render(t, prof)
			r := compat.Run(p.Machine, filepath.Join(root, "sys"))
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
		})
	}
}

func TestNUMAMinusOneIsNotPublished(t *testing.T) {
	root, p := render(t, "t4-vm")
	r := compat.Run(p.Machine, filepath.Join(root, "sys"))
	requireOK(t, r)
	for _, x := range r.Results {
		if x.Consumer == compat.NUMAScalar {
			require.Equal(t, "not published (numa_node=-1)", x.Detail)
		}
	}
}

// The matrix must go red when the tree is wrong: each case breaks one
// thing a consumer relies on.
func TestFailuresAreCaught(t *testing.T) {
	tests := []struct {
		name     string
		break_   func(t *testing.T, root string, p *plan.Plan)
		consumer string
		detail   string
	}{
		{
			name: "plain escaped link loses pcieRoot",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				relink(t, root, p, "0000:53:00.0", func(n *plan.Node) string { return plan.EscapedTarget(p.ContainerRoot, n.SysPath()) })
			},
			consumer: compat.PCIeRoot, detail: "it must start with devices/pci",
		},
		{
			name: "unreadable vendor aborts go-nvlib's scan",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				require.NoError(t, os.Remove(filepath.Join(root, plan.LinksDir, "0000:50:01.0", "vendor")))
			},
			consumer: compat.AllDevices, detail: "unable to read PCI vendor",
		},
		{
			name: "wrong class",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, "0000:64:00.0", "class"), []byte("0x030000\n"), 0o644))
			},
			consumer: compat.GPUByBusID, detail: "class 0x30000, want 0x30200",
		},
		{
			name: "wrong numa node",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, "0000:97:00.0", "numa_node"), []byte("0\n"), 0o644))
			},
			consumer: compat.NUMAScalar, detail: "got 0, want 1",
		},
		{
			name: "missing GPU",
			break_: func(t *testing.T, root string, p *plan.Plan) {
				require.NoError(t, os.Remove(filepath.Join(root, plan.LinksDir, "0000:ca:00.0")))
			},
			consumer: compat.GPUs, detail: "got [",
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
			consumer: compat.BARMemory, detail: "want",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, p := render(t, "hgx-h100")
			tt.break_(t, root, p)
			r := compat.Run(p.Machine, filepath.Join(root, "sys"))
			require.False(t, r.OK())
			var hit bool
			for _, f := range r.Failures() {
				if f.Consumer == tt.consumer && strings.Contains(f.Detail, tt.detail) {
					hit = true
				}
			}
			require.True(t, hit, "want a %s failure with %q, got %+v", tt.consumer, tt.detail, r.Failures())
		})
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
	root, _ := render(t, "hgx-h100")
	p, src, err := builtin.Load("dgx-a100")
	require.NoError(t, err)
	other, err := profile.Normalize(src, p, profile.Options{})
	require.NoError(t, err)
	r := compat.Run(other, filepath.Join(root, "sys"))
	require.False(t, r.OK())
	require.NotEmpty(t, r.Failures())
}
