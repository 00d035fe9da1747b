package plancheck

import (
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// builtinPlan plans a built-in profile; ok is false when the hierarchy
// refuses it (T4s sit on the root bus: flat only).
func builtinPlan(t *testing.T, name string, h boards.Hierarchy) (*plan.Plan, bool) {
	t.Helper()
	b, found := builtin.Get(name)
	require.True(t, found, name)
	m, err := profile.Normalize(name, b, profile.Options{Hierarchy: h})
	if err != nil {
		return nil, false
	}
	p, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	return p, true
}

func builtinPlans(t *testing.T) []*plan.Plan {
	t.Helper()
	var out []*plan.Plan
	for _, name := range builtin.Names() {
		for _, h := range []boards.Hierarchy{"", boards.Flat, boards.HGX, boards.DGX} {
			if p, ok := builtinPlan(t, name, h); ok {
				out = append(out, p)
			}
		}
	}
	require.GreaterOrEqual(t, len(out), 12)
	return out
}

func TestBuiltinPlansKeepInvariants(t *testing.T) {
	for _, p := range builtinPlans(t) {
		require.Empty(t, CheckPlan(p, ""), "%s, %s", p.Machine.Source, p.Machine.Hierarchy)
	}
}

// TestCheckPlanFindsBrokenPlans breaks a good plan in each way CheckPlan
// looks for: it must notice every one.
func TestCheckPlanFindsBrokenPlans(t *testing.T) {
	gpuLink := plan.LinksDir + "/0000:53:00.0"
	cases := []struct {
		name   string
		mutate func(p *plan.Plan)
		want   string
	}{
		{"a link out of the overlay", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "/etc"})
		}, "absolute link out of the overlay"},
		{"a link climbing out", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "../.."})
		}, "out of the overlay"},
		{"a dangling link", func(p *plan.Plan) {
			p.Entries = append(p.Entries, plan.Entry{Path: "sys/evil", Kind: plan.Symlink, Target: "nowhere"})
		}, "file does not exist"},
		{"an endpoint's plain escaped text", func(p *plan.Plan) {
			setTarget(p, gpuLink, plan.EscapedTarget(p.ContainerRoot, nodeOf(p, "0000:53:00.0").SysPath()))
		}, "not devices/pci.../0000:53:00.0"},
		{"an upper-case entry", func(p *plan.Plan) {
			e := entryOf(p, gpuLink)
			e.Path = plan.LinksDir + "/0000:5A:00.0"
			p.Entries = append(p.Entries, e)
		}, "not a lower-case BDF"},
		{"a missing entry", func(p *plan.Plan) {
			p.Entries = slices.DeleteFunc(p.Entries, func(e plan.Entry) bool { return e.Path == gpuLink })
		}, gpuLink + ": missing"},
		{"a child outside its bridge's range", func(p *plan.Plan) {
			nodeOf(p, "0000:52:00.0").Subordinate = 0x52
		}, "do not fit"},
		{"config space disagrees", func(p *plan.Plan) {
			n := nodeOf(p, "0000:51:00.0")
			n.Secondary, n.Subordinate = 0x52, 0x5f
		}, "config: buses"},
		{"an HCA on another NUMA node than its GPU", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").NUMANode = 1
		}, "HCA on NUMA node 1, its GPU 0000:53:00.0 on 0"},
		{"an HCA paired with another switch's GPU", func(p *plan.Plan) {
			p.Tree.HCAs[0].GPU = nodeOf(p, "0000:64:00.0")
		}, "not its GPU 0000:64:00.0's"},
		{"a GPU without its HCA", func(p *plan.Plan) {
			p.Tree.HCAs = p.Tree.HCAs[1:]
		}, "0000:53:00.0: GPU with 0 HCAs, want 1"},
		{"an HCA at a GPU's address", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").Address = nodeOf(p, "0000:53:00.0").Address
		}, "0000:53:00.0: two functions at one address"},
		{"an HCA with a GPU's class", func(p *plan.Plan) {
			nodeOf(p, "0000:54:00.0").Identity.Class = profile.Class3DController
		}, "want 15b3:1021 class 020700"},
		{"an HCA on a host device's bus", func(p *plan.Plan) {
			p.HostDevices = append(p.HostDevices, plan.HostDevice{Address: nodeOf(p, "0000:54:00.0").Address})
		}, "buses 52-54 hold host device 0000:54:00.0"},
		{"a world-writable file", func(p *plan.Plan) {
			p.Entries[len(p.Entries)/2].Mode = 0o666
		}, "mode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := builtinPlan(t, "hgx-h100", "")
			require.True(t, ok)
			tc.mutate(p)
			bad := CheckPlan(p, "")
			require.NotEmpty(t, bad)
			require.Contains(t, strings.Join(bad, "\n"), tc.want)
		})
	}
}

func nodeOf(p *plan.Plan, bdf string) *plan.Node {
	for _, n := range p.Tree.Nodes() {
		if n.Address.String() == bdf {
			return n
		}
	}
	panic(bdf)
}

func entryOf(p *plan.Plan, path string) plan.Entry {
	for _, e := range p.Entries {
		if e.Path == path {
			return e
		}
	}
	panic(path)
}

func setTarget(p *plan.Plan, path, target string) {
	for i := range p.Entries {
		if p.Entries[i].Path == path {
			p.Entries[i].Target = target
		}
	}
}
