package programs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// ServableProfile returns a profile file that both the renderer and the
// mock NVML read: file itself when it names a format version, a driver
// version and each device's uuid and minor_number, which nvml-mock's NVML
// requires and this tool ignores, else a copy of data in dir that adds
// them. The suites run held-out profiles through it (never a built-in,
// which states them: BuiltinProfile), so a profile written for the
// renderer alone still reaches GFD and the DRA driver: without a UUID and a minor number of its own, every GPU is
// gpu-0 to the DRA driver, whose ResourceSlice controller then refuses
// the pool ("duplicate device").
func ServableProfile(dir, name, file string, data []byte) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("profile %s: %w", name, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	system, _ := doc["system"].(map[string]any)
	identified := profile.IdentifyDevices(doc)
	if file != "" && doc["version"] != nil && system["driver_version"] != nil && identified {
		return file, nil
	}
	if system == nil {
		system = map[string]any{}
	}
	if system["driver_version"] == nil {
		system["driver_version"] = profile.MockNVMLDriverVersion
	}
	doc["system"] = system
	if doc["version"] == nil {
		doc["version"] = "1.0"
	}
	out, err := yaml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("profile %s: %w", name, err)
	}
	header := "# " + name + " with the format and driver versions nvml-mock's NVML requires.\n"
	derived := filepath.Join(dir, filepath.Base(name)+".yaml")
	if err := os.WriteFile(derived, append([]byte(header), out...), 0o644); err != nil {
		return "", err
	}
	return derived, nil
}

// NVMLProfile returns the profile nvml-mock's NVML serves on the node a
// servable profile file describes: file itself, unless some of its GPUs
// are bound to vfio-pci (pci.driver). A real passthrough node's NVML lists
// no such GPU (no nvidia driver holds it), while nvml-mock's NVML lists
// every GPU of its profile; so, as docs/user/passthrough.md tells users to run
// it, NVML gets a copy in dir of the nvidia-bound GPUs alone, at their bus
// ids and with their uuids, renumbered 0..n-1 as NVML indexes them, and
// the tree is still rendered from the whole file. Which GPUs are on
// vfio-pci is Normalize's answer, as the render's.
func NVMLProfile(dir, name, file string) (string, error) {
	p, err := profile.LoadFile(file)
	if err != nil {
		return "", err
	}
	m, err := profile.Normalize(file, p, profile.Options{})
	if err != nil {
		return "", err
	}
	// The vfio-pci GPUs, by devices[] index and by address.
	vfio, vfioAt := map[int]bool{}, map[pciaddr.Address]bool{}
	gpus := m.GPUs()
	for _, g := range m.GPUsOn(profile.DriverVFIO) {
		vfio[g.Index], vfioAt[g.Address] = true, true
	}
	switch {
	case len(vfio) == 0:
		return file, nil
	case len(vfio) == len(gpus):
		// nvml-mock's NVML makes 8 GPUs of a profile without devices.
		return "", fmt.Errorf("profile %s: every GPU is bound to %s: such a node serves no nvml-mock NVML (no MOCK_NVML_CONFIG), and the suites run NVML's consumers on every profile", name, profile.DriverVFIO)
	case len(p.Devices) != len(gpus):
		// Renumbering would move a GPU that device_defaults alone makes.
		return "", fmt.Errorf("profile %s: system.num_devices gives %d GPUs, devices[] lists %d: list every GPU in devices[] to serve NVML the nvidia-bound ones alone", name, len(gpus), len(p.Devices))
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("profile %s: %w", name, err)
	}
	devices, _ := doc["devices"].([]any)
	type entry struct {
		index int
		dev   map[string]any
	}
	var kept []entry
	for i, d := range devices {
		dev, ok := d.(map[string]any)
		if !ok {
			return "", fmt.Errorf("profile %s: devices[%d] is not a mapping", name, i)
		}
		index := i
		if n, ok := dev["index"].(int); ok {
			index = n
		}
		if !vfio[index] {
			kept = append(kept, entry{index, dev})
		}
	}
	slices.SortFunc(kept, func(a, b entry) int { return a.index - b.index })
	out := make([]any, len(kept))
	for i, e := range kept {
		e.dev["index"] = i
		out[i] = e.dev
	}
	doc["devices"] = out
	if system, ok := doc["system"].(map[string]any); ok && system["num_devices"] != nil {
		system["num_devices"] = len(kept)
	}
	// The topology may place only devices the profile declares.
	if topo, ok := doc["pcie_topology"].(map[string]any); ok {
		rcs, _ := topo["root_complexes"].([]any)
		for _, r := range rcs {
			rc, ok := r.(map[string]any)
			if !ok {
				continue
			}
			listed, _ := rc["devices"].([]any)
			placed := []any{}
			for _, l := range listed {
				s, _ := l.(string)
				if a, err := pciaddr.Parse(s); err != nil || !vfioAt[a] {
					placed = append(placed, l)
				}
			}
			rc["devices"] = placed
		}
	}
	body, err := yaml.Marshal(doc)
	if err != nil {
		return "", fmt.Errorf("profile %s: %w", name, err)
	}
	header := fmt.Sprintf("# %s as nvml-mock's NVML serves it on a passthrough node: the nvidia-bound GPUs alone (%d), without the %d bound to %s.\n", name, len(kept), len(vfio), profile.DriverVFIO)
	derived := filepath.Join(dir, filepath.Base(name)+"-nvml.yaml")
	if err := os.WriteFile(derived, append([]byte(header), body...), 0o644); err != nil {
		return "", err
	}
	return derived, nil
}
