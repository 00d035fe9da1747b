package programs

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// SuiteProfile is one profile of the end-to-end suites: a file that both
// the renderer and the mock NVML read, so NVML and sysfs describe one
// machine.
type SuiteProfile struct {
	Name string // the matrix's row label
	File string
	// Literal names the profile in profilefacts' literals of the suites'
	// own profiles (a built-in's name, a file's without .yaml); empty for
	// an extra, which no literal judges.
	Literal string
}

// Facts are the profile's facts as profilefacts reads them from its file,
// with the literals of the suites' own profiles where it leaves a fact to
// the renderer: the suites' expectations, apart from the renderer's.
func (p SuiteProfile) Facts(t testing.TB) *profilefacts.Profile {
	t.Helper()
	f, err := profilefacts.Read(p.File)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Literal(p.Literal); err != nil {
		t.Fatal(err)
	}
	return f
}

// ExtraProfilesEnv names a variable listing more profile files for the
// suites, separated by colons: make e2e (or e2e-k8s)
// E2E_PROFILES=a.yaml:b.yaml runs profiles the suites were not written
// against through the same programs.
const ExtraProfilesEnv = "NVML_MOCK_SYSFS_E2E_PROFILES"

// SuiteProfiles lists every built-in, every profile of
// ../shared/testdata/nvml-mock-profiles, the consumer suite's own (two PCI
// domains, VGA class, roots without an HCA, in
// testdata/suite-profiles), the repository's
// profiles of nvml-mock's newest shapes and of a passthrough node
// (repoShapes), and any named in ExtraProfilesEnv: the one profile set of
// the consumer matrix and the Kubernetes suites.
func SuiteProfiles(t testing.TB) []SuiteProfile {
	t.Helper()
	var out []SuiteProfile
	for _, name := range shipped.Names() {
		out = append(out, SuiteProfile{Name: "built-in " + name, File: BuiltinProfile(t, name), Literal: name})
	}
	shared, err := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
	if err != nil || len(shared) == 0 {
		t.Fatalf("no nvml-mock profiles in ../shared/testdata/nvml-mock-profiles: %v", err)
	}
	for _, f := range shared {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		out = append(out, SuiteProfile{Name: "shared " + name, File: servableFile(t, f), Literal: name})
	}
	own, err := filepath.Glob(filepath.Join(overlaytest.Repo(t), "testdata/suite-profiles/*.yaml"))
	if err != nil || len(own) == 0 {
		t.Fatalf("no profiles in testdata/suite-profiles: %v", err)
	}
	for _, f := range own {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		out = append(out, SuiteProfile{Name: name, File: servableFile(t, f), Literal: name})
	}
	// The repository's profiles of nvml-mock's newest shapes and of a
	// passthrough node.
	for _, f := range overlaytest.RepoProfiles(t) {
		if !slices.Contains(repoShapes(), filepath.Base(f)) {
			continue
		}
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		out = append(out, SuiteProfile{Name: name, File: servableFile(t, f), Literal: name})
	}
	return append(out, ExtraProfiles(t)...)
}

// ExtraProfiles are the profiles ExtraProfilesEnv names, none when it is
// unset: the node suite runs these alone through the deploy path, where
// each takes a ConfigMap swap (a minute or more).
func ExtraProfiles(t testing.TB) []SuiteProfile {
	t.Helper()
	var out []SuiteProfile
	for _, f := range filepath.SplitList(os.Getenv(ExtraProfilesEnv)) {
		abs, err := filepath.Abs(f)
		if err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(abs)
		if err != nil {
			t.Fatalf("%s: %v", ExtraProfilesEnv, err)
		}
		out = append(out, SuiteProfile{Name: "extra " + filepath.Base(f), File: servable(t, filepath.Base(f), abs, data)})
	}
	return out
}

// repoShapes are the repository's profiles the suites run: nvml-mock's
// newest shapes (non-zero domains with upper-case bus ids, NVL72 switches
// off the bus, switches with device ids, ConnectX-8 and -9 HCAs two per
// GPU, a cpu block, boards known by name behind placeholder ids) and a
// passthrough node (GPUs bound to vfio-pci).
func repoShapes() []string {
	return []string{"vera-rubin-tray.yaml", "gb300-tray.yaml", "b200-hgx.yaml", "vfio-passthrough.yaml"}
}

// servableFile is servable of a profile file: the file itself when the
// mock NVML can serve it as it is.
func servableFile(t testing.TB, file string) string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return servable(t, strings.TrimSuffix(filepath.Base(file), ".yaml"), file, data)
}

// BuiltinProfile writes a built-in as a profile file: the very bytes
// `profiles --show` prints (shipped.File), which nvml-mock's NVML serves
// as they are. Nothing is added, as nothing is for a user: a built-in that
// NVML could not serve fails the suites (and TestBuiltinsServeNVML).
func BuiltinProfile(t testing.TB, name string) string {
	t.Helper()
	data, ok, err := shipped.File(name)
	if err != nil || !ok {
		t.Fatalf("built-in %s: %v", name, err)
	}
	file := filepath.Join(t.TempDir(), name+".yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// servable is ServableProfile in a test's temporary directory.
func servable(t testing.TB, name, file string, data []byte) string {
	t.Helper()
	out, err := ServableProfile(t.TempDir(), name, file, data)
	if err != nil {
		t.Fatal(err)
	}
	return out
}
