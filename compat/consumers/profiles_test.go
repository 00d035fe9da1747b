package consumers_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/consumers"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/builtin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// suiteProfile is one profile of the suite: a file that both the renderer
// and the mock NVML read, so NVML and sysfs describe one machine.
type suiteProfile struct {
	Name string // the matrix's row label
	File string
}

// extraProfilesEnv names a variable listing more profile files for the
// suite, separated by colons: make e2e E2E_PROFILES=a.yaml:b.yaml runs
// profiles the suite was not written against through the same programs.
const extraProfilesEnv = "NVML_MOCK_SYSFS_E2E_PROFILES"

// suiteProfiles lists every built-in, every profile of
// ../shared/testdata/nvml-mock-profiles, nvml-mock's own four configs from
// the k8s-test-infra tarball, the suite's own (two PCI domains, VGA
// class), and any named in extraProfilesEnv.
func suiteProfiles(t *testing.T) []suiteProfile {
	t.Helper()
	var out []suiteProfile
	for _, name := range builtin.Names() {
		out = append(out, suiteProfile{Name: "built-in " + name, File: builtinFile(t, name)})
	}
	shared, err := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	if err != nil || len(shared) == 0 {
		t.Fatalf("no nvml-mock profiles in ../shared/testdata/nvml-mock-profiles: %v", err)
	}
	for _, f := range shared {
		out = append(out, suiteProfile{Name: "shared " + strings.TrimSuffix(filepath.Base(f), ".yaml"), File: f})
	}
	configs := consumers.Need(t, consumers.NvmlMockConfigs())
	for _, f := range consumers.NvmlMockConfigs().Outputs {
		out = append(out, suiteProfile{Name: "nvml-mock " + strings.TrimSuffix(strings.TrimPrefix(f, "mock-nvml-config-"), ".yaml"), File: filepath.Join(configs, f)})
	}
	own, err := filepath.Glob("testdata/profiles/*.yaml")
	if err != nil || len(own) == 0 {
		t.Fatalf("no profiles in testdata/profiles: %v", err)
	}
	for _, f := range own {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, suiteProfile{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), File: abs})
	}
	// The repository's profiles of nvml-mock's newest shapes (issue 25) and
	// of a passthrough node (issue 26).
	for _, f := range overlaytest.RepoProfiles(t) {
		if !slices.Contains(repoShapes(), filepath.Base(f)) {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, suiteProfile{Name: strings.TrimSuffix(filepath.Base(f), ".yaml"), File: servable(t, filepath.Base(f), f, data)})
	}
	for _, f := range filepath.SplitList(os.Getenv(extraProfilesEnv)) {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(abs)
		if err != nil {
			t.Fatalf("%s: %v", extraProfilesEnv, err)
		}
		out = append(out, suiteProfile{Name: "extra " + filepath.Base(f), File: servable(t, filepath.Base(f), abs, data)})
	}
	return out
}

// repoShapes are the repository's profiles the suite runs: nvml-mock's
// newest shapes (non-zero domains with upper-case bus ids, NVL72 switches
// off the bus, switches with device ids, ConnectX-8 and -9 HCAs two per
// GPU, a cpu block, boards known by name behind placeholder ids) and a
// passthrough node (GPUs bound to vfio-pci).
func repoShapes() []string {
	return []string{"vera-rubin-tray.yaml", "gb300-tray.yaml", "b200-hgx.yaml", "vfio-passthrough.yaml"}
}

// builtinFile writes a built-in as a profile file the mock NVML accepts:
// its effective profile, with every value explicit.
func builtinFile(t *testing.T, name string) string {
	t.Helper()
	m, err := overlay.LoadMachine(name, "")
	if err != nil {
		t.Fatal(err)
	}
	data, err := profile.Marshal(m.Effective(), "")
	if err != nil {
		t.Fatal(err)
	}
	return servable(t, name, "", data)
}

// servable is consumers.ServableProfile in a test's temporary directory.
func servable(t *testing.T, name, file string, data []byte) string {
	t.Helper()
	out, err := consumers.ServableProfile(t.TempDir(), name, file, data)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
