package profile

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"gopkg.in/yaml.v3"
)

// Effective writes the machine back as a profile with every value explicit.
// Normalize turns it into the same machine, so verify can later check a
// container against exactly what was rendered.
func (m *Machine) Effective() *Profile {
	p := &Profile{Version: "1.0"}
	topo := &PCIeTopology{Hierarchy: string(m.Hierarchy)}
	byRC := map[string][]string{}
	var switches []Device
	for _, d := range m.Devices {
		byRC[d.RootComplex.String()] = append(byRC[d.RootComplex.String()], d.Address.String())
		if d.Kind == NVSwitch {
			switches = append(switches, d)
			continue
		}
		index := d.Index
		p.Devices = append(p.Devices, DeviceConfig{
			Index: &index,
			Name:  d.Name,
			PCI: PCIConfig{
				BusID:       d.Address.String(),
				DeviceID:    Pack(d.Vendor, d.DeviceID),
				SubsystemID: Pack(d.SubsystemVendor, d.SubsystemDevice),
				Class:       ptr(Word(d.Class)),
				Driver:      vfioOnly(d.Driver),
			},
			PCIe: PCIeConfig{
				MaxLinkGen: ptr(d.Link.MaxGen), CurrentLinkGen: ptr(d.Link.CurrentGen),
				MaxLinkWidth: ptr(d.Link.MaxWidth), CurrentLinkWidth: ptr(d.Link.CurrentWidth),
			},
			BAR1Memory: MemoryConfig{TotalBytes: ptr(d.BAR1Bytes)},
		})
		written := &p.Devices[len(p.Devices)-1]
		uuid, minor := gpuNVMLIdentity(index, written)
		// NVMLFacts' for a reader of the struct, the Effective fields' in
		// the JSON file, as the driver version is written back.
		if d.UUID != uuid {
			written.UUID, written.EffectiveUUID = d.UUID, d.UUID
		}
		if d.Minor != minor {
			written.MinorNumber, written.EffectiveMinorNumber = ptr(d.Minor), ptr(d.Minor)
		}
	}
	offBus := len(switches) // switches[offBus:] are off the bus
	switches = append(switches, m.OffBusSwitches...)
	if len(switches) > 0 {
		configs := make([]NVSwitchConfig, len(switches))
		for i, d := range switches {
			configs[i] = NVSwitchConfig{BDF: d.Address.String(), DeviceID: Pack(d.Vendor, d.DeviceID)}
			if i >= offBus {
				// As the profile gave it, without a device_id: Normalize
				// leaves it off the bus again.
				configs[i].DeviceID = nil
			}
		}
		// Keep the declared order, so that each switch keeps its index.
		order := make([]int, len(switches))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int { return switches[a].Index - switches[b].Index })
		p.NVLink = &NVLink{}
		for _, i := range order {
			p.NVLink.Switches = append(p.NVLink.Switches, configs[i])
		}
	}
	for _, rc := range m.RootComplexes {
		topo.RootComplexes = append(topo.RootComplexes, RootComplexConfig{
			ID: rc.ID.String(), NUMANode: ptr(rc.NUMANode), Devices: byRC[rc.ID.String()],
		})
	}
	p.PCIeTopology = topo
	m.effectiveExtras(p)
	return p
}

// MarshalJSON writes a profile as indented JSON: valid YAML that Parse
// reads, and many times faster to write than YAML for large machines.
func MarshalJSON(p *Profile) ([]byte, error) {
	out, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode profile: %w", err)
	}
	return append(out, '\n'), nil
}

// Marshal writes a profile as YAML.
func Marshal(p *Profile, header string) ([]byte, error) {
	var buf bytes.Buffer
	for _, line := range bytes.Split([]byte(header), []byte("\n")) {
		if len(line) > 0 {
			fmt.Fprintf(&buf, "# %s\n", line)
		}
	}
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(p); err != nil {
		return nil, fmt.Errorf("encode profile: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("encode profile: %w", err)
	}
	return buf.Bytes(), nil
}

func ptr[T any](v T) *T { return &v }

// vfioOnly writes a GPU's driver back only where it is not the default, so
// that effective profiles of nvidia-bound GPUs stay as they were.
func vfioOnly(driver string) string {
	if driver == DriverNVIDIA {
		return ""
	}
	return driver
}
