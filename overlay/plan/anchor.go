package plan

import (
	"fmt"
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// addAnchors gives every endpoint the depth-4 bridge its link starts from.
// A bridge above the endpoint at depth 4 is the natural choice; a tree with
// none (a flat VM layout, or numbering too tight for switches) gets a root
// port and a PCI bridge in some free pair of buses, as real servers have in
// front of their BMC.
func addAnchors(t *Tree, builders *[]*rcBuilder, reserved map[pciaddr.Address]bool, reservedBus map[[2]uint16]string) error {
	var anchors []*Node
	for _, b := range *builders {
		anchors = append(anchors, depth4Bridges(b.root.Children)...)
	}
	if len(anchors) == 0 {
		a, err := addAnchorChain(t, builders, reserved, reservedBus)
		if err != nil {
			return err
		}
		anchors = append(anchors, a)
	}
	pick := newAnchorPicker(anchors)
	for _, b := range *builders {
		for _, n := range b.root.Children {
			walk(n, func(n *Node) {
				if n.Role == Endpoint {
					n.Anchor = pick.pick(n)
				}
			})
		}
	}
	return nil
}

func walk(n *Node, f func(*Node)) {
	f(n)
	for _, c := range n.Children {
		walk(c, f)
	}
}

// depth returns how many path elements below sys/ the node's directory has.
func depth(n *Node) int {
	d := 3 // devices/pciDDDD:BB/<node>
	for p := n.Parent; p != nil; p = p.Parent {
		d++
	}
	return d
}

func depth4Bridges(top []*Node) []*Node {
	var out []*Node
	for _, n := range top {
		walk(n, func(n *Node) {
			if n.Role.IsBridge() && depth(n) == sysfs.LinksDepth {
				out = append(out, n)
			}
		})
	}
	return out
}

// anchorPicker prefers the endpoint's own ancestor, then a bridge under
// the same root complex, then one in the same domain, then any: looked up
// in maps, so that a machine with thousands of anchors is not quadratic.
type anchorPicker struct {
	first    *Node
	byRC     map[pciaddr.RootComplex]*Node
	byDomain map[uint16]*Node
}

func newAnchorPicker(anchors []*Node) anchorPicker {
	p := anchorPicker{first: anchors[0], byRC: map[pciaddr.RootComplex]*Node{}, byDomain: map[uint16]*Node{}}
	for _, a := range anchors {
		rc := rootComplexOf(a)
		if _, ok := p.byRC[rc]; !ok {
			p.byRC[rc] = a
		}
		if _, ok := p.byDomain[rc.Domain]; !ok {
			p.byDomain[rc.Domain] = a
		}
	}
	return p
}

func (p anchorPicker) pick(n *Node) *Node {
	for a := n.Parent; a != nil; a = a.Parent {
		if depth(a) == sysfs.LinksDepth {
			return a
		}
	}
	rc := rootComplexOf(n)
	if a, ok := p.byRC[rc]; ok {
		return a
	}
	if a, ok := p.byDomain[rc.Domain]; ok {
		return a
	}
	return p.first
}

// rootComplexOf finds a node's host bridge before the tree is indexed: the
// root port's bus is the root bus.
func rootComplexOf(n *Node) pciaddr.RootComplex {
	for n.Parent != nil {
		n = n.Parent
	}
	return n.Address.RootComplex()
}

// addAnchorChain adds a root port and a PCI bridge below it, in the first
// root complex with two free buses outside every other range, or failing
// that under a new host bridge in an unused domain.
func addAnchorChain(t *Tree, builders *[]*rcBuilder, reserved map[pciaddr.Address]bool, reservedBus map[[2]uint16]string) (*Node, error) {
	for _, b := range *builders {
		bus, ok := b.freeBusPair()
		if !ok {
			continue
		}
		dev, fn, ok := b.freeRootPortSlot()
		if !ok {
			continue
		}
		return b.anchorChain(bus, dev, fn), nil
	}
	used := map[uint16]bool{}
	for _, b := range *builders {
		used[b.root.ID.Domain] = true
	}
	for a := range reserved {
		used[a.Domain] = true
	}
	for d := 0; d <= 0xffff; d++ {
		if used[uint16(d)] {
			continue
		}
		b := &rcBuilder{
			root:        TreeRoot{ID: pciaddr.RootComplex{Domain: uint16(d)}, Synthetic: true},
			limit:       0xff,
			hierarchy:   t.Hierarchy,
			reserved:    reserved,
			reservedBus: reservedBus,
			usedDev:     map[uint8]bool{1: true},
		}
		*builders = append(*builders, b)
		return b.anchorChain(1, 1, 0), nil
	}
	return nil, fmt.Errorf("no room for an anchor bridge: every PCI domain is in use")
}

// freeBusPair finds two consecutive buses that no endpoint, host device or
// bridge range of this root complex uses.
func (b *rcBuilder) freeBusPair() (uint8, bool) {
	used := make([]bool, 256)
	used[b.root.ID.Bus] = true
	for _, n := range b.root.Children {
		walk(n, func(n *Node) {
			used[n.Address.Bus] = true
			if n.Role.IsBridge() {
				for x := int(n.Secondary); x <= int(n.Subordinate); x++ {
					used[x] = true
				}
			}
		})
	}
	for x := int(b.root.ID.Bus) + 1; x+1 <= int(b.limit); x++ {
		if !used[x] && !used[x+1] && !b.isReservedBus(uint8(x)) && !b.isReservedBus(uint8(x+1)) {
			return uint8(x), true
		}
	}
	return 0, false
}

func (b *rcBuilder) anchorChain(bus, dev, fn uint8) *Node {
	rp := b.addRootPort(dev, fn, bus, bus+1)
	return b.addBridge(rp, PCIBridge, bus, anchorBridgeIdentity(b.hierarchy))
}

// index sorts children by address, then fixes every node's path, root
// complex, NUMA node and depth-first position.
func (t *Tree) index() {
	t.nodes = t.nodes[:0]
	for i := range t.RootComplexes {
		rc := &t.RootComplexes[i]
		var visit func(n *Node, dir string)
		visit = func(n *Node, dir string) {
			n.sysPath = dir + "/" + n.Address.String()
			n.RootComplex = rc.ID
			if n.Role != Endpoint {
				n.NUMANode = rc.NUMANode
			}
			n.ordinal = len(t.nodes)
			t.nodes = append(t.nodes, n)
			sortByAddress(n.Children)
			for _, c := range n.Children {
				visit(c, n.sysPath)
			}
		}
		sortByAddress(rc.Children)
		for _, n := range rc.Children {
			visit(n, "devices/"+rc.ID.String())
		}
	}
}

func sortByAddress(ns []*Node) {
	slices.SortFunc(ns, func(a, b *Node) int { return a.Address.Compare(b.Address) })
}
