package consumers

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// MockNVMLDriverVersion is the driver version a derived profile gives the
// mock NVML, which refuses a profile without one: nvml-mock's own.
const MockNVMLDriverVersion = "550.163.01"

// ServableProfile returns a profile file that both the renderer and the
// mock NVML read: file itself when it names a format version, a driver
// version and each device's uuid and minor_number, which nvml-mock's NVML
// requires and this tool ignores, else a copy of data in dir that adds
// them. The suites run held-out profiles and the built-ins through it, so
// a profile written for the renderer alone still reaches GFD and the DRA
// driver: without a UUID and a minor number of its own, every GPU is
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
	identified := identifyDevices(doc)
	if file != "" && doc["version"] != nil && system["driver_version"] != nil && identified {
		return file, nil
	}
	if system == nil {
		system = map[string]any{}
	}
	if system["driver_version"] == nil {
		system["driver_version"] = MockNVMLDriverVersion
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

// identifyDevices gives each device of doc that lacks them a uuid (stable:
// a digest of its index and bus id) and a minor_number (its index), and
// reports whether every device had both already.
func identifyDevices(doc map[string]any) bool {
	devices, _ := doc["devices"].([]any)
	had := true
	for i, d := range devices {
		dev, ok := d.(map[string]any)
		if !ok {
			continue
		}
		index := i
		if n, ok := dev["index"].(int); ok {
			index = n
		}
		if dev["minor_number"] == nil {
			dev["minor_number"], had = index, false
		}
		if dev["uuid"] == nil {
			pci, _ := dev["pci"].(map[string]any)
			h := sha256.Sum256(fmt.Appendf(nil, "%d %v", index, pci["bus_id"]))
			dev["uuid"], had = fmt.Sprintf("GPU-%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16]), false
		}
	}
	return had
}
