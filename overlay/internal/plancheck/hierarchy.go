package plancheck

import (
	"fmt"
	"maps"
	"slices"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// CheckTree checks what a real PCI hierarchy guarantees of a planned tree,
// and returns one message per violation:
//
//   - every node sits, in its root complex's domain, on the bus of what
//     holds it: the root bus directly under a root complex, else its
//     parent bridge's secondary bus; it names that root complex and that
//     parent;
//   - a bridge's range starts after its own bus and lies inside its
//     parent's range, or for a bridge on the root bus inside the buses its
//     root complex owns (pciaddr.LastBus), and siblings' ranges do not
//     overlap. By induction every node then lies inside every ancestor's
//     range and its root complex's buses;
//   - no two functions share an address, none takes a reserved address
//     (the host's own devices) and no bridge range holds a reserved
//     address's bus;
//   - the endpoints are the profile's devices, each at its own address,
//     and the tree's HCAs, each exactly once;
//   - every endpoint has an anchor: a bridge sysfs.LinksDepth levels below
//     sys/, and its own ancestor at that depth when it has one;
//   - each GPU has the machine's HCAs, each on its GPU's root complex and
//     NUMA node, behind the GPU's own PCIe switch or a root port of its own.
func CheckTree(m *profile.Machine, t *plan.Tree, reserved []pciaddr.Address) []string {
	c := &checker{m: m, t: t}
	c.hierarchy(reserved)
	c.hcas()
	return c.bad
}

// checker gathers the messages of one check of a tree or a plan.
type checker struct {
	m *profile.Machine
	t *plan.Tree
	// For a plan only.
	p           *plan.Plan
	files       Tree
	hostDevices string
	bad         []string
}

func (c *checker) fail(format string, args ...any) {
	c.bad = append(c.bad, fmt.Sprintf(format, args...))
}

// walk is the state of one pass over the tree.
type walk struct {
	*checker
	rc          pciaddr.RootComplex
	seen        map[pciaddr.Address]bool
	reserved    map[pciaddr.Address]bool
	reservedBus map[[2]uint16]pciaddr.Address // domain, bus -> the reserved address on it
	// missing counts each address the profile and the HCAs want as an
	// endpoint, less each endpoint found there.
	missing map[pciaddr.Address]int
}

func (c *checker) hierarchy(reserved []pciaddr.Address) {
	w := &walk{
		checker:     c,
		seen:        map[pciaddr.Address]bool{},
		reserved:    map[pciaddr.Address]bool{},
		reservedBus: map[[2]uint16]pciaddr.Address{},
		missing:     map[pciaddr.Address]int{},
	}
	for _, a := range reserved {
		w.reserved[a] = true
		w.reservedBus[[2]uint16{a.Domain, uint16(a.Bus)}] = a
	}
	for _, d := range c.m.Devices {
		w.missing[d.Address]++
	}
	for _, h := range c.t.HCAs {
		w.missing[h.Node.Address]++
	}
	ids := make([]pciaddr.RootComplex, 0, len(c.t.RootComplexes))
	for _, rc := range c.t.RootComplexes {
		ids = append(ids, rc.ID)
	}
	for _, rc := range c.t.RootComplexes {
		w.rc = rc.ID
		w.children(nil, rc.Children, int(rc.ID.Bus), int(rc.ID.Bus)+1, int(pciaddr.LastBus(ids, rc.ID)))
	}
	for _, a := range slices.SortedFunc(maps.Keys(w.missing), pciaddr.Address.Compare) {
		switch n := w.missing[a]; {
		case n > 0:
			c.fail("%s: the profile's devices and HCAs want %d more endpoints here", a, n)
		case n < 0:
			c.fail("%s: an endpoint the profile does not list", a)
		}
	}
}

// children checks the nodes below parent (nil for a root complex), which
// sit on bus and whose bridges' ranges must lie in [lo, hi] without
// overlapping.
func (w *walk) children(parent *plan.Node, kids []*plan.Node, bus, lo, hi int) {
	under := w.rc.String()
	if parent != nil {
		under = parent.Address.String()
	}
	var taken [][2]int
	for _, n := range kids {
		a := n.Address
		if w.seen[a] {
			w.fail("%s: two functions at one address", a)
		}
		w.seen[a] = true
		if w.reserved[a] {
			w.fail("%s: a mock %s at a host device's address", a, n.Role)
		}
		if a.Domain != w.rc.Domain || int(a.Bus) != bus {
			w.fail("%s sits under %s, whose devices are on bus %04x:%02x", a, under, w.rc.Domain, bus)
		}
		if n.RootComplex != w.rc {
			w.fail("%s: names root complex %s, but sits under %s", a, n.RootComplex, w.rc)
		}
		if n.Parent != parent {
			w.fail("%s: its parent is not %s, which holds it", a, under)
		}
		if n.Role == plan.Endpoint {
			w.endpoint(n)
			continue
		}
		sec, sub := int(n.Secondary), int(n.Subordinate)
		if sec > sub || sec < lo || sub > hi {
			w.fail("%s: buses %02x-%02x do not fit in %02x-%02x under %s", a, sec, sub, lo, hi, under)
		}
		for _, r := range taken {
			if sec <= r[1] && r[0] <= sub {
				w.fail("%s: buses %02x-%02x overlap a sibling's %02x-%02x", a, sec, sub, r[0], r[1])
			}
		}
		taken = append(taken, [2]int{sec, sub})
		for x := sec; x <= sub; x++ {
			if h, ok := w.reservedBus[[2]uint16{a.Domain, uint16(x)}]; ok {
				w.fail("%s: buses %02x-%02x hold host device %s", a, sec, sub, h)
			}
		}
		w.children(n, n.Children, sec, sec+1, sub)
	}
}

// endpoint checks an endpoint's device and anchor.
func (w *walk) endpoint(n *plan.Node) {
	a := n.Address
	w.missing[a]--
	if len(n.Children) > 0 {
		w.fail("%s: an endpoint with %d functions below it", a, len(n.Children))
	}
	switch {
	case n.Device == nil:
		w.fail("%s: an endpoint with no profile device", a)
	case n.Device.Address != a:
		w.fail("%s: the endpoint of profile device %s", a, n.Device.Address)
	}
	switch an := n.Anchor; {
	case an == nil:
		w.fail("%s: no anchor", a)
	case !an.Role.IsBridge():
		w.fail("%s: anchor %s (%s) is not a bridge", a, an.Address, an.Role)
	case an.Depth() != sysfs.LinksDepth:
		w.fail("%s: anchor %s is %d levels below sys/, not %d", a, an.Address, an.Depth(), sysfs.LinksDepth)
	}
	for p := n.Parent; p != nil; p = p.Parent {
		if p.Depth() == sysfs.LinksDepth && p != n.Anchor {
			w.fail("%s: anchor %s, not its own ancestor %s at depth %d", a, anchorName(n.Anchor), p.Address, sysfs.LinksDepth)
		}
	}
}

// anchorName names an anchor in a message, which may be missing.
func anchorName(n *plan.Node) string {
	if n == nil {
		return "none"
	}
	return n.Address.String()
}
