package consumers

import (
	"fmt"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"
)

// MockNVMLDriverVersion is the driver version a derived profile gives the
// mock NVML, which refuses a profile without one: nvml-mock's own.
const MockNVMLDriverVersion = "550.163.01"

// ServableProfile returns a profile file that both the renderer and the
// mock NVML read: file itself when it names a format version and a driver
// version, which nvml-mock's NVML requires and this tool ignores, else a
// copy of data in dir that adds them. The suites run held-out profiles
// through it, so a profile written for the renderer alone still reaches
// GFD and the DRA driver.
func ServableProfile(dir, name, file string, data []byte) (string, error) {
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return "", fmt.Errorf("profile %s: %w", name, err)
	}
	if doc == nil {
		doc = map[string]any{}
	}
	system, _ := doc["system"].(map[string]any)
	if file != "" && doc["version"] != nil && system["driver_version"] != nil {
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
