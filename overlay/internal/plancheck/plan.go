package plancheck

import (
	"cmp"
	"path"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// CheckPlan checks the invariants every plan must keep, and returns one
// message per violation:
//
//   - its tree keeps CheckTree's invariants, with the host's devices as
//     the reserved addresses;
//   - every path is clean and relative, and listed once, after its parent;
//   - files are 0644 (the installed binary 0755), directories 0755;
//   - every link resolves inside the overlay; a link whose text is
//     absolute must lead under hostDevices (the host's /sys/devices, for
//     merged host devices), and with hostDevices "" none may;
//   - the links directory has one entry per mock device, named by its
//     lower-case BDF, resolving to that device's directory;
//   - it lists the bridges' entries and the host devices' before any
//     endpoint's, whose text may pass through them; a bridge's text is
//     plan.EscapedTarget's, and an endpoint's starts from its anchor's entry;
//   - every endpoint's text cleans lexically, as deviceattribute reads it,
//     to devices/pci.../<bdf>, the very path the kernel resolves;
//   - every node's config space says what the node and its other files
//     say (CheckConfig), and its BARs what its resource file and board say
//     (CheckBARs); every bridge's windows hold the BARs below it
//     (CheckWindows).
func CheckPlan(p *plan.Plan, hostDevices string) []string {
	c := &checker{m: p.Machine, t: p.Tree, p: p, files: FromEntries(p.Entries), hostDevices: hostDevices}
	c.hierarchy(plan.HostAddresses(p.HostDevices))
	c.hcas()
	c.entries()
	c.links()
	for _, n := range p.Tree.Nodes() {
		c.bad = append(c.bad, c.files.CheckConfig(n)...)
		c.bad = append(c.bad, c.files.CheckBARs(n)...)
	}
	c.bad = append(c.bad, c.files.CheckWindows(p.Tree)...)
	return c.bad
}

func (c *checker) entries() {
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

func (c *checker) link(e plan.Entry) {
	if path.IsAbs(e.Target) {
		if c.hostDevices == "" || !strings.HasPrefix(e.Target+"/", c.hostDevices+"/") {
			c.fail("%s -> %s: an absolute link out of the overlay", e.Path, e.Target)
		}
		return
	}
	if _, err := c.files.Resolve(e.Path); err != nil && !(c.hostDevices != "" && IsEscape(err)) {
		c.fail("%s -> %s: %v", e.Path, e.Target, err)
	}
}

// links checks the links directory against the tree's nodes.
func (c *checker) links() {
	mock := map[string]*plan.Node{}
	for _, n := range c.t.Nodes() {
		mock[n.Address.String()] = n
	}
	listed := map[string]bool{}
	endpoint := "" // the first endpoint's entry
	for _, e := range c.p.Entries {
		if path.Dir(e.Path) != plan.LinksDir {
			continue
		}
		bdf := path.Base(e.Path)
		n, ok := mock[bdf]
		switch {
		case ok && n.Role == plan.Endpoint:
			endpoint = cmp.Or(endpoint, e.Path)
		case endpoint != "":
			c.fail("%s: listed after %s, an endpoint whose link may pass through it", e.Path, endpoint)
		}
		if e.Kind != plan.Symlink {
			c.fail("%s is a %s, not a symlink", e.Path, e.Kind)
			continue
		}
		listed[bdf] = true
		if !lowerBDF(bdf) {
			c.fail("%s: the name is not a lower-case BDF", e.Path)
			continue
		}
		if !ok {
			if c.hostDevices == "" {
				c.fail("%s: no mock device has this address", e.Path)
			}
			continue // a host device's kernel-form link
		}
		c.linkText(e, n)
		if msg := c.files.CheckEntry(e.Path); msg != "" {
			c.fail("%s", msg)
			continue
		}
		if dir, _ := c.files.Resolve(e.Path); dir != "sys/"+n.SysPath() {
			c.fail("%s resolves to %s, not to its node's sys/%s", e.Path, dir, n.SysPath())
		}
	}
	for bdf := range mock {
		if !listed[bdf] {
			c.fail("%s/%s: missing", plan.LinksDir, bdf)
		}
	}
}

// linkText checks the text of a mock device's entry: the escaped form for
// a bridge; for an endpoint, a text that starts from its anchor's entry
// and cleans lexically to its own directory.
func (c *checker) linkText(e plan.Entry, n *plan.Node) {
	if n.Role != plan.Endpoint {
		if want := plan.EscapedTarget(c.p.ContainerRoot, n.SysPath()); e.Target != want {
			c.fail("%s -> %s, not the escaped text %s", e.Path, e.Target, want)
		}
		return
	}
	if first, _, _ := strings.Cut(e.Target, "/"); first != anchorName(n.Anchor) {
		c.fail("%s -> %s starts from %s, not from its anchor %s", e.Path, e.Target, first, anchorName(n.Anchor))
	}
	bdf := n.Address.String()
	lexical := path.Clean(path.Join(sysfs.LinksDir, e.Target))
	if !strings.HasPrefix(lexical, "devices/pci") || !strings.HasSuffix(lexical, "/"+bdf) {
		c.fail("%s -> %s cleans to %s, not devices/pci.../%s", e.Path, e.Target, lexical, bdf)
	} else if lexical != n.SysPath() {
		c.fail("%s -> %s cleans to %s, but the device is at %s", e.Path, e.Target, lexical, n.SysPath())
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
