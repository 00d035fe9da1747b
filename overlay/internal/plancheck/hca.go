package plancheck

import (
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// hcas checks the machine's HCAs against their GPUs.
func (c *checker) hcas() {
	spec := c.m.HCAs
	count := map[*plan.Node]int{}
	listed := map[*plan.Node]bool{}
	for _, h := range c.t.HCAs {
		n, g := h.Node, h.GPU
		listed[n] = true
		count[g]++
		a := n.Address
		switch {
		case spec == nil:
			c.fail("%s: an HCA, but the machine has no infiniband block", a)
			continue
		case n.Role != plan.Endpoint || n.Device == nil || n.Device.Kind != profile.HCA:
			c.fail("%s: listed as an HCA but is a %s", a, n.Role)
			continue
		case g.Device == nil || g.Device.Kind != profile.GPU:
			c.fail("%s: the HCA's GPU %s is not a GPU", a, g.Address)
			continue
		}
		id := n.Identity
		if id.Vendor != boards.VendorMellanox || id.Device != spec.Device || id.Class != spec.Class {
			c.fail("%s: HCA %04x:%04x class %06x, want %04x:%04x class %06x", a, id.Vendor, id.Device, id.Class, boards.VendorMellanox, spec.Device, spec.Class)
		}
		if n.RootComplex != g.RootComplex {
			c.fail("%s: HCA on %s, its GPU %s on %s", a, n.RootComplex, g.Address, g.RootComplex)
		}
		if n.NUMANode != g.NUMANode {
			c.fail("%s: HCA on NUMA node %d, its GPU %s on %d", a, n.NUMANode, g.Address, g.NUMANode)
		}
		switch p := n.Parent; {
		case p == nil:
			c.fail("%s: an HCA on the root bus", a)
		case p.Role == plan.RootPort:
			if len(p.Children) != 1 {
				c.fail("%s: the HCA's root port %s is shared", a, p.Address)
			}
		case p.Role == plan.SwitchDown:
			if g.Parent == nil || g.Parent.Role != plan.SwitchDown || g.Parent.Parent != p.Parent {
				c.fail("%s: HCA behind switch %s, not its GPU %s's", a, p.Parent.Address, g.Address)
			}
		default:
			c.fail("%s: an HCA behind a %s", a, p.Role)
		}
	}
	for _, n := range c.t.Nodes() {
		if n.Role != plan.Endpoint || n.Device == nil {
			continue // the tree's own check names an endpoint with no device
		}
		switch {
		case n.Device.Kind == profile.HCA && !listed[n]:
			c.fail("%s: an HCA no GPU owns", n.Address)
		case n.Device.Kind == profile.GPU && spec != nil && count[n] != hcasOf(spec, n.Device.Index):
			c.fail("%s: GPU with %d HCAs, want %d", n.Address, count[n], hcasOf(spec, n.Device.Index))
		}
	}
}

// hcasOf is how many HCAs the GPU of device index should have.
func hcasOf(spec *profile.HCASpec, index int) int {
	if !spec.Carries(index) {
		return 0
	}
	return spec.PerGPU
}
