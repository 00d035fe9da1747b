package programs_test

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// TestBuiltinsServeNVML hands nvml-mock's NVML, where it is supplied, each
// built-in as `profiles --show` prints it (BuiltinProfile, nothing added)
// and lists what it serves through nvml-list, as GFD and the DRA driver
// load it: every GPU the profile lists, at its bus id, with the name,
// brand, architecture, compute capability and memory the profile states
// (its board's). Its control, run each time: hgx-h100 without
// system.driver_version, which nvml-mock's NVML refuses, serving its own
// A100s instead, must fail the same check.
func TestBuiltinsServeNVML(t *testing.T) {
	lib, ok := programs.NeedSupplied(t, programs.MockNVML)
	if !ok {
		t.Log(programs.NotRun("nvml-mock's NVML serves each built-in as it is", programs.MockNVML))
		return
	}
	list := programs.NeedBinary(t, programs.NVMLList())
	for _, name := range shipped.Names() {
		t.Run(name, func(t *testing.T) {
			file := programs.BuiltinProfile(t, name)
			if problems := servedAsStated(t, list, filepath.Dir(lib), file); len(problems) > 0 {
				t.Errorf("nvml-mock's NVML on built-in %s as `profiles --show` prints it:\n%s", name, strings.Join(problems, "\n"))
			}
		})
	}
	t.Run("control: no driver_version", func(t *testing.T) {
		data, err := os.ReadFile(programs.BuiltinProfile(t, "hgx-h100"))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatal(err)
		}
		delete(doc["system"].(map[string]any), "driver_version")
		stripped, err := yaml.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "hgx-h100-no-driver.yaml")
		if err := os.WriteFile(file, stripped, 0o644); err != nil {
			t.Fatal(err)
		}
		problems := servedAsStated(t, list, filepath.Dir(lib), file)
		if len(problems) == 0 {
			t.Fatal("nvml-mock's NVML served hgx-h100 without system.driver_version as stated: the check cannot see a refused profile")
		}
		t.Logf("control red as it must be: %s", problems[0])
	})
}

// statedProfile is what a profile states that NVML reports, read here
// from the file itself, apart from the product's reader.
type statedProfile struct {
	DeviceDefaults struct {
		Name              string `yaml:"name"`
		Brand             string `yaml:"brand"`
		Architecture      string `yaml:"architecture"`
		ComputeCapability struct {
			Major, Minor int
		} `yaml:"compute_capability"`
		Memory struct {
			TotalBytes uint64 `yaml:"total_bytes"`
		} `yaml:"memory"`
	} `yaml:"device_defaults"`
	Devices []struct {
		PCI struct {
			BusID string `yaml:"bus_id"`
		} `yaml:"pci"`
	} `yaml:"devices"`
}

// servedAsStated runs nvml-list on the profile file with the NVML in
// libDir and lists, one line each, where what it serves differs from
// what the file states: a GPU count, a bus id, a fact.
func servedAsStated(t *testing.T, list, libDir, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var want statedProfile
	if err := yaml.Unmarshal(data, &want); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	inv := programs.NVMLListRun{Binary: list, NVMLDir: libDir, Profile: file}.Invocation()
	cmd := exec.Command(inv.Args[0], inv.Args[1:]...)
	cmd.Env = append(os.Environ(), inv.Env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("nvml-list on %s: %v: %s", file, err, stderr.String())
	}
	served, err := programs.ParseNVMLDevices(out)
	if err != nil {
		t.Fatal(err)
	}
	var problems []string
	if len(served) != len(want.Devices) {
		problems = append(problems, fmt.Sprintf("NVML serves %d GPUs, the profile lists %d", len(served), len(want.Devices)))
	}
	d := want.DeviceDefaults
	for i, g := range served {
		if i < len(want.Devices) {
			if got, err := g.Address(); err != nil || got.String() != busID(t, want.Devices[i].PCI.BusID) {
				problems = append(problems, fmt.Sprintf("GPU %d at %s, the profile's devices[%d] at %s", i, g.BusID, i, want.Devices[i].PCI.BusID))
			}
		}
		for _, c := range []struct{ what, got, want string }{
			{"name", g.Name, d.Name},
			{"brand", g.Brand, d.Brand},
			{"architecture", g.Architecture, d.Architecture},
			{"compute capability", g.ComputeCapability, fmt.Sprintf("%d.%d", d.ComputeCapability.Major, d.ComputeCapability.Minor)},
			{"memory", fmt.Sprint(g.MemoryBytes), fmt.Sprint(d.Memory.TotalBytes)},
		} {
			if c.got != c.want {
				problems = append(problems, fmt.Sprintf("GPU %d (%s): %s %q, the profile states %q", i, g.BusID, c.what, c.got, c.want))
			}
		}
	}
	return problems
}

// busID is a profile's bus id as sysfs names it.
func busID(t *testing.T, s string) string {
	t.Helper()
	a, err := pciaddr.Parse(s)
	if err != nil {
		t.Fatalf("bus id %q: %v", s, err)
	}
	return a.String()
}
