package programs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
)

// NVML is the NVML library the suites' NVML consumers (GFD, nvml-list, the
// DRA driver) load: nvml-mock's when it is supplied, else our stand-in.
// Either serves the nvml-mock profile file that NVMLConfigEnv names, so a
// suite runs both alike; every row the stand-in serves says so (Name).
type NVML struct {
	// Dir holds libnvidia-ml.so.1 (and, for the stand-in, the converter
	// it runs).
	Dir string
	// StandIn is true when Dir holds our stand-in.
	StandIn bool
}

// StandInConverter is the program beside the stand-in library that turns
// the profile NVMLConfigEnv names into the flat lines the library reads
// (./deploy/e2e/programs/nvml-stand-in-config): the profile parser is the
// product's, in Go, and the library stays a small C file.
const StandInConverter = "nvml-stand-in-config"

// NeedNVML returns nvml-mock's NVML when it is supplied, else our stand-in
// in a directory of t's, saying so in the test's log.
func NeedNVML(t testing.TB) NVML {
	t.Helper()
	SkipShort(t)
	p, err := (Supplied{}).Path(MockNVML)
	if err == nil {
		return NVML{Dir: filepath.Dir(p)}
	}
	t.Logf("%v: the NVML rows load our stand-in and say so", err)
	dir := t.TempDir()
	for from, to := range map[string]string{
		filepath.Join(Need(t, NVMLStandIn()), MockNVML):                    MockNVML,
		hosttest.BuildStatic(t, "./deploy/e2e/programs/"+StandInConverter): StandInConverter,
	} {
		data, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, to), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return NVML{Dir: dir, StandIn: true}
}

// Name names the library in the matrices' rows.
func (n NVML) Name() string {
	if n.StandIn {
		return "NVML stand-in"
	}
	return "nvml-mock's NVML"
}

// NVMLConfigEnv is the variable naming the nvml-mock profile an NVML
// serves: nvml-mock's own, which the stand-in reads too.
const NVMLConfigEnv = "MOCK_NVML_CONFIG"

// NVMLEnv is the environment that makes a program load the
// libnvidia-ml.so.1 in dir and serve the profile file.
func NVMLEnv(dir, profile string) []string {
	return []string{"LD_LIBRARY_PATH=" + dir, NVMLConfigEnv + "=" + profile}
}
