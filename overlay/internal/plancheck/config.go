package plancheck

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// capList is the capability list the planner promises (offset, id): PM,
// MSI and PCI Express, then the end.
func capList() [][2]int {
	return [][2]int{{plan.CapPMAt, sysfs.CapPM}, {plan.CapMSIAt, sysfs.CapMSI}, {plan.CapPCIeAt, sysfs.CapPCIe}}
}

// CheckConfig decodes a node's config file and checks it against the node
// and the node's other files, as lspci and go-nvlib read them, and returns
// one message per violation:
//
//   - the file is the whole 4 KiB extended space;
//   - ids, class and revision are the node's; command and status are a
//     real H100's; the interrupt line is the irq file;
//   - a bridge has header type 1 and the node's primary, secondary and
//     subordinate buses, which its bus number files also say; an endpoint
//     has header type 0 and the node's subsystem ids;
//   - the capability list is PM, MSI, PCI Express, without a loop;
//   - the PCI Express capability has the role's port type, and its link
//     registers say what the link speed and width files say.
func (t Tree) CheckConfig(n *plan.Node) []string {
	var bad []string
	fail := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	dir := "sys/" + n.SysPath() + "/"
	file := func(name string) string { return string(t[dir+name].Data) }
	cfg := t[dir+"config"].Data
	if len(cfg) != sysfs.ConfigSize {
		fail("%sconfig: %d bytes, not the %d of a PCIe function", dir, len(cfg), sysfs.ConfigSize)
		return bad
	}
	le16 := func(off int) uint16 { return binary.LittleEndian.Uint16(cfg[off:]) }
	le32 := func(off int) uint32 { return binary.LittleEndian.Uint32(cfg[off:]) }
	reg16 := func(name string, off int, want uint16) {
		if got := le16(off); got != want {
			fail("%sconfig: %s %#04x, want %#04x", dir, name, got, want)
		}
	}

	id := n.Identity
	reg16("vendor", sysfs.ConfigVendorID, id.Vendor)
	reg16("device", sysfs.ConfigDeviceID, id.Device)
	reg16("command", sysfs.ConfigCommand, plan.Command)
	reg16("status", sysfs.ConfigStatus, sysfs.StatusCapList)
	if got := cfg[sysfs.ConfigRevision]; got != id.Revision {
		fail("%sconfig: revision %#02x, want %#02x", dir, got, id.Revision)
	}
	class := uint32(cfg[sysfs.ConfigClass+2])<<16 | uint32(cfg[sysfs.ConfigClass+1])<<8 | uint32(cfg[sysfs.ConfigClass])
	if got := class; got != id.Class {
		fail("%sconfig: class %06x, want %06x", dir, got, id.Class)
	}
	if irq, err := strconv.Atoi(strings.TrimSpace(file("irq"))); err != nil {
		fail("%sirq: %v", dir, err)
	} else if cfg[sysfs.ConfigIRQLine] != byte(irq) {
		fail("%sconfig: interrupt line %d, but the irq file says %d", dir, cfg[sysfs.ConfigIRQLine], irq)
	}

	header := cfg[sysfs.ConfigHeaderType] & sysfs.HeaderTypeMask
	if n.Role.IsBridge() {
		if header != sysfs.HeaderTypeBridge {
			fail("%sconfig: header type %d, but a bridge's is 1", dir, header)
		}
		pri, sec, sub := cfg[sysfs.ConfigPrimaryBus], cfg[sysfs.ConfigSecondaryBus], cfg[sysfs.ConfigSubordinateBus]
		if pri != n.Address.Bus || sec != n.Secondary || sub != n.Subordinate {
			fail("%sconfig: buses %02x/%02x/%02x, node %02x/%02x/%02x", dir, pri, sec, sub, n.Address.Bus, n.Secondary, n.Subordinate)
		}
		for _, f := range []struct {
			name string
			want uint8
		}{{"secondary_bus_number", n.Secondary}, {"subordinate_bus_number", n.Subordinate}} {
			if got := file(f.name); got != strconv.Itoa(int(f.want))+"\n" {
				fail("%s%s is %q, want %d", dir, f.name, got, f.want)
			}
		}
	} else {
		if header != sysfs.HeaderTypeEndpoint {
			fail("%sconfig: header type %d, but an endpoint's is 0", dir, header)
		}
		reg16("subsystem vendor", sysfs.ConfigSubsystemVID, id.SubsystemVendor)
		reg16("subsystem device", sysfs.ConfigSubsystemID, id.SubsystemDevice)
	}

	var caps [][2]int
	seen := map[int]bool{}
	for off := int(cfg[sysfs.ConfigCapPointer]); off != 0; off = int(cfg[off+1]) {
		if seen[off] || off < sysfs.ConfigHeaderSize {
			fail("%sconfig: capability list %x, then %#x", dir, caps, off)
			return bad
		}
		seen[off] = true
		caps = append(caps, [2]int{off, int(cfg[off])})
	}
	if !slices.Equal(caps, capList()) {
		fail("%sconfig: capabilities (offset, id) %x, want %x", dir, caps, capList())
		return bad
	}

	pcie := plan.CapPCIeAt
	want, _ := plan.PCIePortType(n.Role)
	if got := sysfs.PCIePortTypeOf(le16(pcie + sysfs.PCIeCapabilities)); got != want {
		fail("%sconfig: PCIe port type %d, want %d for a %s", dir, got, want, n.Role)
	}
	lnkCap, lnkSta := le32(pcie+sysfs.PCIeLinkCap), uint32(le16(pcie+sysfs.PCIeLinkStatus))
	for _, r := range []struct {
		reg, speedFile, widthFile string
		value                     uint32
	}{
		{"LnkCap", "max_link_speed", "max_link_width", lnkCap},
		{"LnkSta", "current_link_speed", "current_link_width", lnkSta},
	} {
		gen, width := sysfs.LinkSpeedGen(r.value), sysfs.LinkWidth(r.value)
		if got := file(r.speedFile); got != sysfs.LinkSpeed(gen)+"\n" {
			fail("%sconfig: %s speed Gen%d, but %s is %q", dir, r.reg, gen, r.speedFile, got)
		}
		if got := file(r.widthFile); got != strconv.Itoa(width)+"\n" {
			fail("%sconfig: %s width x%d, but %s is %q", dir, r.reg, width, r.widthFile, got)
		}
	}
	return bad
}
