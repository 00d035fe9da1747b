package profile

import (
	"fmt"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
)

// NVMLMaxDevices is how many devices nvml-mock's NVML reports at most
// (MaxDevices in pkg/gpu/mocknvml/engine/device.go).
const NVMLMaxDevices = 8

// Identity is what a GPU consumer matches between NVML and sysfs: the
// address, and the device and subsystem words NVML packs as
// (device<<16)|vendor, as nvmlDeviceGetPciInfo's pciDeviceId and
// pciSubSystemId carry them.
type Identity struct {
	Address     pciaddr.Address
	DeviceID    uint32
	SubsystemID uint32
}

// String names an identity the way both sides can be compared by eye:
// 0000:1a:00.0 10de:2330 subsystem 10de:1658.
func (id Identity) String() string {
	return fmt.Sprintf("%s %04x:%04x subsystem %04x:%04x", id.Address,
		uint16(id.DeviceID), id.DeviceID>>16, uint16(id.SubsystemID), id.SubsystemID>>16)
}

// IdentityOf is a rendered GPU's identity.
func IdentityOf(d Device) Identity {
	return Identity{
		Address:     d.Address,
		DeviceID:    uint32(*Pack(d.Vendor, d.DeviceID)),
		SubsystemID: uint32(*Pack(d.SubsystemVendor, d.SubsystemDevice)),
	}
}

// NVMLGPU is one GPU as nvml-mock's NVML reports it for a profile.
type NVMLGPU struct {
	Index int
	// BusID is nvmlPciInfo_t.busId: the 8-digit domain, upper case
	// (00000000:1A:00.0), as the engine's formatPCIBusID writes it.
	BusID string
	Identity
}

// NVMLGPUs lists the GPUs nvml-mock's NVML reports for a profile, by its
// engine's rules (pkg/gpu/mocknvml/engine: applyYAMLConfig,
// createDevicesFromYAML, initPciInfo): devices 0..n-1, where n is
// system.num_devices when it is set, else the number of devices[] entries
// (8 when there are none), and never more than NVMLMaxDevices. Each device's
// address and ids are resolved exactly as Normalize resolves them for the
// render, with one difference NVML has: a device whose profile gives no
// subsystem_id reports 0 rather than the board's own.
//
// Normalize renders the devices[] entries past system.num_devices too; the
// difference is what verify's NVML check exists to show.
func NVMLGPUs(source string, p *Profile) ([]NVMLGPU, error) {
	n := normalizer{source: source, p: p}
	slots, err := n.slots()
	if err != nil {
		return nil, err
	}
	count := len(p.Devices)
	if count == 0 {
		count = NVMLMaxDevices
	}
	if num := p.System.NumDevices; num != nil && *num > 0 {
		count = *num
	}
	count = min(count, NVMLMaxDevices)
	var out []NVMLGPU
	for _, sl := range slots {
		if sl.index >= count {
			continue
		}
		d, _, _, err := n.gpu(sl)
		if err != nil {
			return nil, err
		}
		id := IdentityOf(d)
		var own *Word
		if sl.pos >= 0 {
			own = p.Devices[sl.pos].PCI.SubsystemID
		}
		if firstWord(own, p.DeviceDefaults.PCI.SubsystemID) == nil {
			id.SubsystemID = 0
		}
		a := d.Address
		out = append(out, NVMLGPU{
			Index:    sl.index,
			BusID:    fmt.Sprintf("%08X:%02X:%02X.%X", a.Domain, a.Bus, a.Device, a.Function),
			Identity: id,
		})
	}
	return out, nil
}

// MatchIdentities compares the GPUs NVML reports with the GPUs another side
// shows (a sysfs, a built-in profile), by address. It returns one line per
// difference, naming both sides; none when they agree. A zero subsystem on
// NVML's side is not compared: NVML reports 0 when the profile gives none.
func MatchIdentities(nvml []Identity, otherName string, other []Identity) []string {
	byAddress := map[pciaddr.Address]Identity{}
	for _, o := range other {
		byAddress[o.Address] = o
	}
	var problems []string
	seen := map[pciaddr.Address]bool{}
	for _, n := range nvml {
		seen[n.Address] = true
		o, ok := byAddress[n.Address]
		switch {
		case !ok:
			problems = append(problems, fmt.Sprintf("NVML reports %s, %s has no GPU at %s", n, otherName, n.Address))
		case n.DeviceID != o.DeviceID || (n.SubsystemID != 0 && n.SubsystemID != o.SubsystemID):
			problems = append(problems, fmt.Sprintf("NVML reports %s, %s shows %s", n, otherName, o))
		}
	}
	for _, o := range other {
		if !seen[o.Address] {
			problems = append(problems, fmt.Sprintf("%s shows %s, NVML reports no GPU at %s", otherName, o, o.Address))
		}
	}
	return problems
}

// Identities lists the identities of NVML's GPUs.
func Identities(gpus []NVMLGPU) []Identity {
	out := make([]Identity, 0, len(gpus))
	for _, g := range gpus {
		out = append(out, g.Identity)
	}
	return out
}
