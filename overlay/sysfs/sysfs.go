// Package sysfs holds the facts about the kernel's PCI sysfs that the
// renderer, the checkers and the deploy code all rely on: where the device
// links live, how deep they sit, how the kernel spells link speeds and
// modaliases, and where config space keeps each register.
//
// Each fact has its one home here, so a reader can trust that a renderer
// and a checker agree because they read the same constant, not because two
// copies happen to match.
package sysfs

import (
	"fmt"
	"slices"
	"strings"
)

// Paths of the kernel's PCI sysfs.
const (
	// Mount is where the kernel mounts sysfs.
	Mount = "/sys"
	// LinksDir is the directory of device links, relative to a sysfs root
	// (the "bus/pci/devices" in /sys/bus/pci/devices). libpci, ghw,
	// go-nvlib and deviceattribute all list devices here.
	LinksDir = "bus/pci/devices"
	// KernelLinksDir is LinksDir where the kernel shows it, and where the
	// overlay's links directory is bind-mounted.
	KernelLinksDir = Mount + "/" + LinksDir
)

// LinksDepth is how many directories deep KernelLinksDir sits below "/"
// (sys, bus, pci, devices). A link in it climbs exactly this many ".." to
// leave sysfs, so any other directory it is served at must be as deep.
//
// It is also the depth, below sys/, of the anchor entry the GPU links go
// through (devices/pciDDDD:BB/<root port>/<anchor>): the same four ".."
// take a path from bus/pci/devices/<entry> lexically to sys/, which is
// what lets deviceattribute's lexical check find the PCIe root.
const LinksDepth = 4

// ModulesDir is the kernel's module directory, relative to a sysfs root
// (/sys/module): a directory per module, built-in or loaded.
const ModulesDir = "module"

// ModulesDepth is how many directories deep /sys/module sits below "/".
// The module view's links climb exactly this many ".." from it (and two
// more from a module's drivers/), so any directory the view is served at
// must be as deep: /sys/module and /host-sys/module, not
// /host-root/sys/module.
const ModulesDepth = 2

// Up is n "../" steps: the relative climb a sysfs link makes.
func Up(n int) string { return strings.Repeat("../", n) }

// MaxLinkGen is the newest PCIe generation the kernel names.
const MaxLinkGen = 6

// ValidLinkGen reports whether gen is a PCIe generation the kernel names
// (1 ... MaxLinkGen).
func ValidLinkGen(gen int) bool { return gen >= 1 && gen <= MaxLinkGen }

// linkSpeeds is the kernel's spelling of each PCIe generation's speed
// (drivers/pci/probe.c, pci_speed_string), index = generation - 1. A
// function, not a variable: the package keeps no globals.
func linkSpeeds() [MaxLinkGen]string {
	return [MaxLinkGen]string{
		"2.5 GT/s PCIe",
		"5.0 GT/s PCIe",
		"8.0 GT/s PCIe",
		"16.0 GT/s PCIe",
		"32.0 GT/s PCIe",
		"64.0 GT/s PCIe",
	}
}

// LinkSpeed is the kernel's current_link_speed/max_link_speed text for a
// PCIe generation (1 = 2.5 GT/s ... 6 = 64 GT/s), "Unknown" for any other,
// as the kernel writes for a speed it does not know.
func LinkSpeed(gen int) string {
	if gen < 1 || gen > MaxLinkGen {
		return "Unknown"
	}
	return linkSpeeds()[gen-1]
}

// LinkGen reads the kernel's spelling of a link speed back as a generation.
func LinkGen(speed string) (int, bool) {
	speeds := linkSpeeds()
	i := slices.Index(speeds[:], speed)
	return i + 1, i >= 0
}

// LinkWidths are the widths a PCIe link can negotiate (x1 ... x32).
func LinkWidths() []int { return []int{1, 2, 4, 8, 12, 16, 32} }

// ValidLinkWidth reports whether w is a width a PCIe link can have.
func ValidLinkWidth(w int) bool { return slices.Contains(LinkWidths(), w) }

// LinkWidthsText lists the valid widths for an error message:
// "1, 2, 4, 8, 12, 16 or 32".
func LinkWidthsText() string {
	ws := LinkWidths()
	s := fmt.Sprint(ws[:len(ws)-1])
	return strings.ReplaceAll(strings.Trim(s, "[]"), " ", ", ") + fmt.Sprintf(" or %d", ws[len(ws)-1])
}

// Modalias is the modalias file's text (without the newline) for a PCI
// function: what udev and go-nvlib's VFIO lookup match drivers against.
// class is the 24-bit class code (base, sub-class, programming interface).
func Modalias(vendor, device, subVendor, subDevice uint16, class uint32) string {
	return fmt.Sprintf("pci:v%08Xd%08Xsv%08Xsd%08Xbc%02Xsc%02Xi%02X",
		vendor, device, subVendor, subDevice, byte(class>>16), byte(class>>8), byte(class))
}
