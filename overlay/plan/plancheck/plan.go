package plancheck

import (
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// CheckPlan checks the invariants every plan must keep, and returns one
// message per violation:
//
//   - every path is clean and relative, and listed once, after its parent;
//   - files are 0644 (the installed binary 0755), directories 0755;
//   - every link resolves inside the overlay; a link whose text is
//     absolute must lead under hostDevices (the host's /sys/devices, for
//     merged host devices), and with hostDevices "" none may;
//   - the links directory has one entry per mock device, named by its
//     lower-case BDF, resolving to that device's directory;
//   - every endpoint's text cleans lexically, as deviceattribute reads it,
//     to devices/pci.../<bdf>, the very path the kernel resolves;
//   - bridge bus ranges hold their children, siblings' ranges do not
//     overlap, and config space and the bus number files agree;
//   - no two functions share an address, none takes a host device's, and
//     no bridge range holds a host device's bus;
//   - each GPU has the machine's HCAs, each on its GPU's root complex and
//     NUMA node, behind the GPU's own PCIe switch or a root port of its own.
func CheckPlan(p *plan.Plan, hostDevices string) []string {
	c := &planChecker{p: p, tree: FromEntries(p.Entries), hostDevices: hostDevices}
	c.entries()
	c.links()
	c.nodes()
	c.addresses()
	c.hcas()
	return c.bad
}

type planChecker struct {
	p           *plan.Plan
	tree        Tree
	hostDevices string
	bad         []string
}

func (c *planChecker) fail(format string, args ...any) {
	c.bad = append(c.bad, fmt.Sprintf(format, args...))
}

func (c *planChecker) entries() {
	seen := map[string]bool{}
	for _, e := range c.p.Entries {
		p := e.Path
		if p == "" || path.Clean(p) != p || path.IsAbs(p) || p == ".." || strings.HasPrefix(p, "../") {
			c.fail("%s: not a clean relative path", p)
			continue
		}
		if seen[p] {
			c.fail("%s: listed twice", p)
		}
		seen[p] = true
		if parent := path.Dir(p); parent != "." && !seen[parent] {
			c.fail("%s: listed before its directory", p)
		}
		switch e.Kind {
		case plan.Dir:
			if e.Mode != 0o755 {
				c.fail("%s: directory mode %v", p, e.Mode)
			}
		case plan.File:
			want := 0o644
			if p == plan.BinaryFile {
				want = 0o755
			}
			if int(e.Mode) != want {
				c.fail("%s: file mode %v", p, e.Mode)
			}
		case plan.Symlink:
			c.link(e)
		}
	}
}

func (c *planChecker) link(e plan.Entry) {
	if path.IsAbs(e.Target) {
		if c.hostDevices == "" || !strings.HasPrefix(e.Target+"/", c.hostDevices+"/") {
			c.fail("%s -> %s: an absolute link out of the overlay", e.Path, e.Target)
		}
		return
	}
	if _, err := c.tree.Resolve(e.Path); err != nil && !(c.hostDevices != "" && IsEscape(err)) {
		c.fail("%s -> %s: %v", e.Path, e.Target, err)
	}
}

// links checks the links directory against the tree's nodes.
func (c *planChecker) links() {
	mock := map[string]*plan.Node{}
	for _, n := range c.p.Tree.Nodes() {
		mock[n.Address.String()] = n
	}
	listed := map[string]bool{}
	for _, e := range c.p.Entries {
		if path.Dir(e.Path) != plan.LinksDir || e.Kind != plan.Symlink {
			continue
		}
		bdf := path.Base(e.Path)
		listed[bdf] = true
		if !lowerBDF(bdf) {
			c.fail("%s: the name is not a lower-case BDF", e.Path)
			continue
		}
		n, ok := mock[bdf]
		if !ok {
			if c.hostDevices == "" {
				c.fail("%s: no mock device has this address", e.Path)
			}
			continue // a host device's kernel-form link
		}
		if msg := c.tree.CheckEntry(e.Path); msg != "" {
			c.fail("%s", msg)
			continue
		}
		if dir, _ := c.tree.Resolve(e.Path); dir != "sys/"+n.SysPath() {
			c.fail("%s resolves to %s, not to its node's sys/%s", e.Path, dir, n.SysPath())
		}
		if n.Role != plan.Endpoint {
			continue
		}
		lexical := path.Clean(path.Join("bus/pci/devices", e.Target))
		if !strings.HasPrefix(lexical, "devices/pci") || !strings.HasSuffix(lexical, "/"+bdf) {
			c.fail("%s -> %s cleans to %s, not devices/pci.../%s", e.Path, e.Target, lexical, bdf)
		} else if lexical != n.SysPath() {
			c.fail("%s -> %s cleans to %s, but the device is at %s", e.Path, e.Target, lexical, n.SysPath())
		}
	}
	for bdf := range mock {
		if !listed[bdf] {
			c.fail("%s/%s: missing", plan.LinksDir, bdf)
		}
	}
}

// nodes checks every node's bus numbers against its parent's range.
func (c *planChecker) nodes() {
	for _, rc := range c.p.Tree.RootComplexes {
		limit := 0xff
		for _, o := range c.p.Tree.RootComplexes {
			if o.ID.Domain == rc.ID.Domain && int(o.ID.Bus) > int(rc.ID.Bus) {
				limit = min(limit, int(o.ID.Bus)-1)
			}
		}
		c.children(rc.ID.String(), rc.ID.Domain, rc.Children, int(rc.ID.Bus), int(rc.ID.Bus)+1, limit)
	}
}

// children checks nodes sitting on bus, whose bridges' ranges must lie in
// [lo, hi] without overlapping.
func (c *planChecker) children(parent string, domain uint16, kids []*plan.Node, bus, lo, hi int) {
	var taken [][2]int
	for _, n := range kids {
		a := n.Address
		if a.Domain != domain || int(a.Bus) != bus {
			c.fail("%s sits under %s, whose devices are on bus %04x:%02x", a, parent, domain, bus)
		}
		if n.Role == plan.Endpoint {
			continue
		}
		sec, sub := int(n.Secondary), int(n.Subordinate)
		if sec > sub || sec < lo || sub > hi {
			c.fail("%s: buses %02x-%02x do not fit in %02x-%02x under %s", a, sec, sub, lo, hi, parent)
		}
		for _, r := range taken {
			if sec <= r[1] && r[0] <= sub {
				c.fail("%s: buses %02x-%02x overlap a sibling's %02x-%02x", a, sec, sub, r[0], r[1])
			}
		}
		taken = append(taken, [2]int{sec, sub})
		c.bridgeFiles(n)
		c.children(a.String(), domain, n.Children, sec, sec+1, sub)
	}
}

// bridgeFiles checks that config space and the bus number files say what
// the node says.
func (c *planChecker) bridgeFiles(n *plan.Node) {
	dir := "sys/" + n.SysPath() + "/"
	cfg := c.tree[dir+"config"].Data
	if len(cfg) < 0x1b {
		c.fail("%sconfig: %d bytes", dir, len(cfg))
		return
	}
	if int(cfg[0x18]) != int(n.Address.Bus) || cfg[0x19] != n.Secondary || cfg[0x1a] != n.Subordinate {
		c.fail("%sconfig: buses %02x/%02x/%02x, node %02x/%02x/%02x", dir, cfg[0x18], cfg[0x19], cfg[0x1a], n.Address.Bus, n.Secondary, n.Subordinate)
	}
	for name, want := range map[string]uint8{"secondary_bus_number": n.Secondary, "subordinate_bus_number": n.Subordinate} {
		if got := string(c.tree[dir+name].Data); got != strconv.Itoa(int(want))+"\n" {
			c.fail("%s%s is %q, want %d", dir, name, got, want)
		}
	}
}

// CheckMachine plans a machine as render does and checks the plan. A
// refusal is fine, but must be one line.
func CheckMachine(m *profile.Machine) []string {
	p, err := plan.New(m, plan.Options{})
	if err != nil {
		if strings.Contains(err.Error(), "\n") {
			return []string{"the planner's refusal spans lines: " + err.Error()}
		}
		return nil
	}
	return CheckPlan(p, "")
}
