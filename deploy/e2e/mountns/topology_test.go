package mountns_test

import (
	"encoding/xml"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
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
			t.Parallel()
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
	t.Parallel()
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
		// Three bridges deep, and its ConnectX-7 on the next port of the switch.
		pattern := fmt.Sprintf(`\[0000:%02x\]---01\.0-\[%02x-%02x\]----00\.0-\[%02x-%02x\]--\+-00\.0-\[%02x\]----00\.0  NVIDIA Corporation GH100\[H100 SXM5 80GB\] \[10de:2330\]\n[ |]+\\-01\.0-\[%02x\]----00\.0  Mellanox Technologies MT2910 Family \[ConnectX-7\] \[15b3:1021\]`,
			r, r+1, r+4, r+2, r+4, r+3, r+4)
		require.Regexp(t, regexp.MustCompile(pattern), tree, "lspci -tv draws %s three bridges deep beside its HCA", n.Address)
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

// TestHCAsBesideTheirGPUs renders every profile with an infiniband block and
// checks, with the real lspci and lstopo, that each HCA sits beside its GPU:
// under the GPU's own PCIe switch (the same upstream port, a sibling
// downstream port), or where the GPU has no switch, on a root port of its
// own under the GPU's host bridge. lspci -PP prints the bridge path it
// walked in sysfs; lstopo's XML nests the same bridges.
func TestHCAsBesideTheirGPUs(t *testing.T) {
	requireNamespace(t)
	profiles := []string{"dgx-a100", "hgx-h100", "gb200-tray"}
	shared, _ := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	for _, name := range append(profiles, shared...) {
		t.Run(filepath.Base(name), func(t *testing.T) {
			t.Parallel()
			root, p := render(t, overlay.Options{Profile: name})
			if p.Machine.HCAs == nil {
				return // t4: no HCAs in the profile
			}
			require.NotEmpty(t, p.Tree.HCAs)
			out := inNamespace(t, root, "lspci -PP -D -n\necho ==lstopo==\nlstopo-no-graphics --whole-io --of xml -")
			lspci, topo, _ := strings.Cut(out, "==lstopo==\n")
			paths := map[string][]string{} // bdf -> bridges above it, as lspci walked them
			for _, l := range lines(lspci) {
				elems := strings.Split(strings.Fields(l)[0], "/")
				bdf := elems[len(elems)-1]
				if !strings.HasPrefix(bdf, "0000:") {
					bdf = "0000:" + bdf
				}
				paths[bdf] = elems[:len(elems)-1]
			}
			devs := hwlocDevices(t, topo)
			switches := 0
			for _, h := range p.Tree.HCAs {
				hca, gpu := h.Node.Address.String(), h.GPU.Address.String()
				hp, gp := paths[hca], paths[gpu]
				require.NotEmpty(t, hp, "lspci lists HCA %s", hca)
				hx, gx := devs[hca], devs[gpu]
				require.Equal(t, gx.host, hx.host, "lstopo: HCA %s under its GPU %s's host bridge", hca, gpu)
				require.Equal(t, fmt.Sprintf("%04x [%04x:%04x]", profile.ClassInfiniBand>>8, boards.VendorMellanox, p.Machine.HCAs.Device), hx.obj.PCIType[:16], "lstopo: HCA %s type", hca)
				if len(gp) >= 3 && h.Node.Parent.Role == plan.SwitchDown {
					switches++
					// The same switch: equal paths down to the upstream port, then
					// a downstream port of its own.
					require.Equal(t, gp[:len(gp)-1], hp[:len(hp)-1], "lspci -PP: HCA %s behind GPU %s's switch", hca, gpu)
					require.NotEqual(t, gp[len(gp)-1], hp[len(hp)-1], "a downstream port of its own")
					require.Equal(t, gx.bridges[:len(gx.bridges)-1], hx.bridges[:len(hx.bridges)-1], "lstopo: HCA %s behind GPU %s's switch", hca, gpu)
					continue
				}
				require.Len(t, hp, 1, "HCA %s on a root port of its own", hca)
				require.Len(t, hx.bridges, 1, "lstopo: HCA %s on a root port of its own", hca)
			}
			if p.Machine.Hierarchy != boards.Flat {
				require.Positive(t, switches, "HCAs share their GPU's switch")
			}
		})
	}
}

// TestMachineTypeFile reads the machine type where GFD's
// --machine-type-file=/opt/nvml-mock/dmi/product_name points, inside the
// namespace, and checks that the host's own DMI file is untouched there.
func TestMachineTypeFile(t *testing.T) {
	requireNamespace(t)
	t.Parallel()
	root, p := render(t, overlay.Options{Profile: "hgx-h100"})
	require.Equal(t, "DGX H100", p.Machine.ProductName)
	const dmi = "/sys/class/dmi/id/product_name"
	host := "absent"
	if data, err := os.ReadFile(dmi); err == nil {
		host = string(data)
	}
	out := inNamespace(t, root, "cat "+path.Join(plan.DefaultContainerRoot, plan.ProductNameFile)+"\necho ==\ncat "+dmi+" 2>/dev/null || echo absent")
	ours, theirs, _ := strings.Cut(out, "==\n")
	require.Equal(t, "DGX H100\n", ours)
	require.Equal(t, strings.TrimSpace(host), strings.TrimSpace(theirs), "the host's DMI is what the namespace sees")
}
