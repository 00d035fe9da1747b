package boards

import (
	"fmt"
	"strconv"
	"strings"
)

// VendorMellanox is Mellanox's (NVIDIA Networking's) PCI vendor id.
const VendorMellanox uint16 = 0x15b3

// HCA is one ConnectX adapter generation as nvml-mock's infiniband block
// names it (hca_type, the "MT<n>" that ibv_devinfo prints): n is its PCI
// device id in decimal, so MT4129 is 0x1021.
//
// Every generation here shows the same physical function identity beside
// its device id, the one lspci shows of ConnectX-4 to ConnectX-7 adapters
// (captures pasted in public issues, e.g. a ConnectX-6 Dx 15b3:101d in
// NVIDIA/l2fwd-nv#6, a ConnectX-4 Lx 15b3:1015 in fbelavenuto/arpl#621):
// subsystem vendor Mellanox (its subsystem device is the device id, as
// on NVIDIA's reference cards), revision 00 (lspci prints no "rev"), the
// link layer's class (0x0207 InfiniBand, 0x0200 Ethernet), and one BAR:
// BAR0 32 MiB 64-bit prefetchable (HCABAR0Bytes) with a 1 MiB expansion
// ROM. No public capture of a ConnectX-8 or ConnectX-9 shows otherwise;
// their device ids and links are NVIDIA's (DPDK 25.11's release notes,
// doc/guides/rel_notes/release_25_11.rst: "ConnectX-8 SuperNIC 400G MT4131
// ... PCI Express 6.0 x16, Device ID: 15b3:1023"; "ConnectX-9 SuperNIC
// 800G MT4133 ... PCI Express 6.0 x16, Device ID: 15b3:1025"), and pci.ids
// names 0x1023 "CX8 Family [ConnectX-8]".
type HCA struct {
	Type      string // MT4129
	Name      string // ConnectX-7
	Device    uint16 // 0x1021
	LinkGen   int    // the generation the adapter trains to in an x16 slot
	LinkWidth int
	// VFDevice is its SR-IOV virtual functions' device id, as pci.ids
	// lists them: ConnectX-5 0x1018, ConnectX-5 Ex 0x101a, ConnectX-6
	// 0x101c, and from ConnectX-6 Dx on one "ConnectX Family mlx5Gen
	// Virtual Function" 0x101e.
	VFDevice uint16
}

// HCAs lists the ConnectX generations nvml-mock profiles name, with the
// PCIe link each trains to.
func HCAs() []HCA {
	return []HCA{
		{Type: "MT4119", Name: "ConnectX-5", Device: 4119, LinkGen: 3, LinkWidth: 16, VFDevice: 0x1018},
		{Type: "MT4121", Name: "ConnectX-5 Ex", Device: 4121, LinkGen: 4, LinkWidth: 16, VFDevice: 0x101a},
		{Type: "MT4123", Name: "ConnectX-6", Device: 4123, LinkGen: 4, LinkWidth: 16, VFDevice: 0x101c},
		{Type: "MT4125", Name: "ConnectX-6 Dx", Device: 4125, LinkGen: 4, LinkWidth: 16, VFDevice: 0x101e},
		{Type: "MT4127", Name: "ConnectX-6 Lx", Device: 4127, LinkGen: 4, LinkWidth: 8, VFDevice: 0x101e},
		{Type: "MT4129", Name: "ConnectX-7", Device: 4129, LinkGen: 5, LinkWidth: 16, VFDevice: 0x101e},
		{Type: "MT4131", Name: "ConnectX-8", Device: 4131, LinkGen: 6, LinkWidth: 16, VFDevice: 0x101e},
		{Type: "MT4133", Name: "ConnectX-9", Device: 4133, LinkGen: 6, LinkWidth: 16, VFDevice: 0x101e},
	}
}

// HCARevision is every ConnectX physical function's revision (see HCA).
const HCARevision = 0x00

// UnknownHCAError is LookupHCA's refusal of a type the table lacks.
type UnknownHCAError struct {
	Type  string // as the profile spells it
	Known []string
}

func (e *UnknownHCAError) Error() string { return fmt.Sprintf("%q: %s", e.Type, e.Reason()) }

// Reason is the message without the type, for callers that name it
// already (a profile's refusal names the field's value).
func (e *UnknownHCAError) Reason() string {
	return "unknown HCA type: want one of " + strings.Join(e.Known, ", ")
}

// LookupHCA finds an HCA by its hca_type, "MT4129" (case and surrounding
// space ignored). It fails with an *UnknownHCAError for any other value.
func LookupHCA(hcaType string) (HCA, error) {
	t := strings.ToUpper(strings.TrimSpace(hcaType))
	if n, err := strconv.ParseUint(strings.TrimPrefix(t, "MT"), 10, 16); err == nil && strings.HasPrefix(t, "MT") {
		for _, h := range HCAs() {
			if uint64(h.Device) == n {
				return h, nil
			}
		}
	}
	var known []string
	for _, h := range HCAs() {
		known = append(known, h.Type+" ("+h.Name+")")
	}
	return HCA{}, &UnknownHCAError{Type: hcaType, Known: known}
}

// HCABAR0Bytes is a ConnectX physical function's BAR0: 32 MiB, 64-bit
// prefetchable, its only BAR.
const HCABAR0Bytes = 32 * mib

// HCAROMBytes is a ConnectX physical function's expansion ROM (FlexBoot):
// 1 MiB, as lspci shows beside BAR0 (see HCA).
const HCAROMBytes = 1 * mib

// DefaultHCA is what an infiniband block without hca_type gets for a GPU
// board without a paired HCA: ConnectX-7, the current generation.
const DefaultHCA = "MT4129"
