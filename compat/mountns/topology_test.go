package mountns_test

import (
	"encoding/xml"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// hwlocObject is an object of lstopo's XML output.
type hwlocObject struct {
	Type       string        `xml:"type,attr"`
	BridgeType string        `xml:"bridge_type,attr"`
	BridgePCI  string        `xml:"bridge_pci,attr"`
	BusID      string        `xml:"pci_busid,attr"`
	PCIType    string        `xml:"pci_type,attr"`
	LinkSpeed  float64       `xml:"pci_link_speed,attr"`
	Children   []hwlocObject `xml:"object"`
}

// hwlocDevice is a PCI function lstopo found, with the PCI bridges above it.
type hwlocDevice struct {
	obj     hwlocObject
	bridges []string // bus ids of the PCI-to-PCI bridges above, outermost first
	host    string   // the host bridge's bus range, as 0000:[50-53]
}

func hwlocDevices(t *testing.T, xmlText string) map[string]hwlocDevice {
	t.Helper()
	var top struct {
		Objects []hwlocObject `xml:"object"`
	}
	require.NoError(t, xml.Unmarshal([]byte(xmlText), &top))
	out := map[string]hwlocDevice{}
	var walk func(o hwlocObject, bridges []string, host string)
	walk = func(o hwlocObject, bridges []string, host string) {
		if o.Type == "Bridge" && o.BridgeType == "0-1" {
			host = o.BridgePCI
		}
		if o.BusID != "" {
			out[o.BusID] = hwlocDevice{obj: o, bridges: slices.Clone(bridges), host: host}
		}
		if o.Type == "Bridge" && o.BusID != "" {
			bridges = append(bridges, o.BusID)
		}
		for _, c := range o.Children {
			walk(c, bridges, host)
		}
	}
	for _, o := range top.Objects {
		walk(o, nil, "")
	}
	return out
}

// linkGBps is hwloc's link speed: GT/s times the encoding, times the
// width, in bytes.
func linkGBps(gen, width int) float64 {
	gt := []float64{0, 2.5, 5, 8, 16, 32}[gen]
	enc := 0.8
	if gen >= 3 {
		enc = 128.0 / 130
	}
	return gt * enc * float64(width) / 8
}

func ancestors(n *plan.Node) []string {
	var out []string
	for p := n.Parent; p != nil; p = p.Parent {
		out = append([]string{p.Address.String()}, out...)
	}
	return out
}

// TestTopologyInNamespace renders every built-in under each hierarchy and
// checks, with the real lspci and lstopo in a mount namespace, that every
// planned function is listed, that each endpoint sits below exactly the
// planned bridges, that bridge bus ranges are the planned ones, and that
// hwloc reads each endpoint's link from its config space.
func TestTopologyInNamespace(t *testing.T) {
	requireNamespace(t)
	for _, c := range allCases(t) {
		t.Run(c.String(), func(t *testing.T) {
			root, p := render(t, overlay.Options{Profile: c.name, Hierarchy: c.hierarchy})
			out := inNamespace(t, root, "lspci -D -n\necho ==lstopo==\nlstopo-no-graphics --whole-io --of xml -")
			lspci, topo, found := strings.Cut(out, "==lstopo==\n")
			require.True(t, found)

			var listed []string
			for _, l := range lines(lspci) {
				listed = append(listed, strings.Fields(l)[0])
			}
			var planned []string
			for _, n := range p.Tree.Nodes() {
				planned = append(planned, n.Address.String())
			}
			slices.Sort(planned)
			require.Equal(t, planned, listed, "lspci lists exactly the planned functions")

			devs := hwlocDevices(t, topo)
			for _, n := range p.Tree.Nodes() {
				bdf := n.Address.String()
				d, ok := devs[bdf]
				require.True(t, ok, "lstopo --whole-io shows %s", bdf)
				require.Equal(t, ancestors(n), d.bridges, "%s: bridges above it", bdf)
				require.True(t, strings.HasPrefix(d.host, fmt.Sprintf("%04x:[%02x-", n.RootComplex.Domain, n.RootComplex.Bus)), "%s under host bridge %s, want %s", bdf, d.host, n.RootComplex)
				if n.Role.IsBridge() {
					require.Equal(t, fmt.Sprintf("%04x:[%02x-%02x]", n.Address.Domain, n.Secondary, n.Subordinate), d.obj.BridgePCI, "%s bus range", bdf)
					continue
				}
				id := n.Identity
				require.Equal(t, fmt.Sprintf("%04x [%04x:%04x] [%04x:%04x] %02x", id.Class>>8, id.Vendor, id.Device, id.SubsystemVendor, id.SubsystemDevice, id.Revision), d.obj.PCIType, bdf)
				require.InDelta(t, linkGBps(n.Link.CurrentGen, n.Link.CurrentWidth), d.obj.LinkSpeed, 0.01, "%s link", bdf)
			}
		})
	}
}

// TestH100LooksLikeHGX is the "done when" line: lspci -tv and lstopo show
// all 8 H100s behind a root port and a PEX890xx switch, three bridges deep
// as on real HGX boards, each with its 128 GiB BAR and Gen5 x16 link.
func TestH100LooksLikeHGX(t *testing.T) {
	requireNamespace(t)
	root, p := render(t, overlay.Options{Profile: "hgx-h100"})
	out := inNamespace(t, root, "lspci -tvnn\necho ==vv==\nlspci -vv -nn -d 10de:2330\necho ==bridges==\nlspci -nn -d 1000:c030\necho ==lstopo==\nlstopo-no-graphics --whole-io")
	tree, rest, _ := strings.Cut(out, "==vv==\n")
	vv, rest, _ := strings.Cut(rest, "==bridges==\n")
	bridges, lstopo, _ := strings.Cut(rest, "==lstopo==\n")

	gpus := 0
	for _, n := range p.Tree.Nodes() {
		if n.Role != plan.Endpoint || n.Identity.Device != 0x2330 {
			continue
		}
		gpus++
		r := n.RootComplex.Bus
		pattern := fmt.Sprintf(`\[0000:%02x\]---01\.0-\[%02x-%02x\]----00\.0-\[%02x-%02x\]----00\.0-\[%02x\]----00\.0  NVIDIA Corporation GH100\[H100 SXM5 80GB\] \[10de:2330\]`,
			r, r+1, r+3, r+2, r+3, r+3)
		require.Regexp(t, regexp.MustCompile(pattern), tree, "lspci -tv draws %s three bridges deep", n.Address)
		// Its upstream switch port and downstream port are PEX890xx.
		for _, a := range ancestors(n)[1:] {
			require.Contains(t, bridges, strings.TrimPrefix(a, "0000:")+" PCI bridge [0604]: Broadcom / LSI PEX890xx PCIe Gen 5 Switch [1000:c030] (rev b0)")
		}
	}
	require.Equal(t, 8, gpus)
	require.Equal(t, 8, strings.Count(vv, "Region 2: Memory at"), "each GPU's BAR2")
	require.Equal(t, 8, strings.Count(vv, "(64-bit, prefetchable) [size=128G]"))
	require.Equal(t, 8, strings.Count(vv, "LnkSta:\tSpeed 32GT/s, Width x16"))
	require.Equal(t, 8, strings.Count(vv, "Kernel driver in use: nvidia"))
	require.Equal(t, 8, strings.Count(vv, "Capabilities: [60] Express (v2) Endpoint"))

	// lstopo's text view: each GPU under its own HostBridge, three
	// PCIBridge levels down.
	hgx := regexp.MustCompile(`(?m)^  HostBridge\n    PCIBridge\n      PCIBridge\n        PCIBridge\n          PCI ([0-9a-f]{2}):00\.0 \(3D\)$`)
	require.Len(t, hgx.FindAllString(lstopo, -1), 8, lstopo)
}
