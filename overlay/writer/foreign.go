package writer

import (
	"fmt"
	"path"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// AnotherRendererError says a root holds another renderer's PCI tree, and
// what to do.
type AnotherRendererError struct {
	Root     string
	Evidence string // the first entry no render of ours made
}

func (e *AnotherRendererError) Error() string {
	return fmt.Sprintf("root %s holds another renderer's PCI tree (%s, which no render of nvml-mock-sysfs made; nvml-mock's render-pci-sysfs writes such trees): left untouched; render into another --root, or stop render-pci-sysfs and remove %s first (docs/user/nvml-mock.md, \"Replacing nvml-mock's render-pci-sysfs\")",
		e.Root, e.Evidence, path.Join(e.Root, "sys"))
}

// checkNoOtherRenderer refuses a root where something other than our
// renders put PCI devices: a device link in the links directory, or a root
// complex directory under sys/devices, that no manifest of ours owns. That
// is the tree of nvml-mock's render-pci-sysfs (3-level links
// sys/bus/pci/devices/<bdf> -> ../../../devices/<root>/<bdf>) or of any
// other renderer. Writing ours among them would mix two trees that
// disagree, and pruning never removes what it does not own, so the root is
// left exactly as it is. Other files (notes, a README) stay welcome.
func (w *apply) checkNoOtherRenderer(owned map[string]ownedEntry) error {
	links, err := w.d.list(plan.LinksDir)
	if err != nil {
		return err
	}
	for _, n := range links {
		p := plan.LinksDir + "/" + n
		if _, mine := owned[p]; mine || !pciaddr.IsBDF(n) {
			continue
		}
		evidence := p
		if target, err := w.d.readlink(p); err == nil {
			evidence += " -> " + target
		}
		return w.anotherRenderer(evidence)
	}
	const devices = "sys/devices"
	roots, err := w.d.list(devices)
	if err != nil {
		return err
	}
	for _, n := range roots {
		p := devices + "/" + n
		if _, mine := owned[p]; !mine && strings.HasPrefix(n, "pci") {
			return w.anotherRenderer(p + "/")
		}
	}
	return nil
}

func (w *apply) anotherRenderer(evidence string) error {
	return &AnotherRendererError{Root: w.d.root, Evidence: evidence}
}
