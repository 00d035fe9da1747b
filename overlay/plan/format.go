package plan

import (
	"fmt"
	"io"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Format writes the tree one node per line, indented by depth, with each
// bridge's bus range and each endpoint's anchor: what render --dry-run shows.
func (t *Tree) Format(w io.Writer) error {
	for _, rc := range t.RootComplexes {
		note := fmt.Sprintf("numa %d", rc.NUMANode)
		if rc.Synthetic {
			note = "added to hold an anchor bridge"
		}
		if _, err := fmt.Fprintf(w, "%s (%s)\n", rc.ID, note); err != nil {
			return err
		}
		for _, n := range rc.Children {
			var err error
			walk(n, func(n *Node) {
				if err == nil {
					_, err = fmt.Fprintf(w, "%s%s\n", strings.Repeat("  ", n.Depth()-2), n.describe())
				}
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func (n *Node) describe() string {
	id := fmt.Sprintf("%s [%04x:%04x] %s", n.Address, n.Identity.Vendor, n.Identity.Device, n.Role)
	if n.Role.IsBridge() {
		s := fmt.Sprintf("%s, buses %02x-%02x", id, n.Secondary, n.Subordinate)
		if n.Depth() == sysfs.LinksDepth {
			s += ", anchor"
		}
		return s
	}
	return fmt.Sprintf("%s: %s, anchor %s", id, n.Device.Kind, n.Anchor.Address)
}
