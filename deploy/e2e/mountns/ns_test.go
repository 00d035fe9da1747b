package mountns_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/compat/fidelity"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest/rendered"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// consumersMode makes the test binary, started again inside a namespace,
// run the consumer libraries at /sys instead of the tests.
const consumersMode = "consumers"

// trees holds the rendered trees: every test here only reads its tree,
// through a read-only mount, so each is rendered once.
var trees rendered.Trees

func TestMain(m *testing.M) {
	if hosttest.ChildMode() == consumersMode {
		os.Exit(runConsumers())
	}
	code := overlaytest.Main(m)
	trees.Close()
	os.Exit(code)
}

// consumerResult is what the child reports from inside the namespace.
type consumerResult struct {
	Compat   *compat.Report `json:"compat"`
	Fidelity []fidelity.Row `json:"fidelity"`
}

// runConsumers runs deviceattribute and go-nvlib with their defaults (/sys)
// and the fidelity check, against the effective profile in the overlay, as
// a process in a container would.
func runConsumers() int {
	p, err := profile.LoadFile(filepath.Join(plan.DefaultContainerRoot, plan.ProfileFile))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := profile.Normalize(plan.ProfileFile, p, profile.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	out := consumerResult{Compat: compat.Run(m, compat.KernelSysfs), Fidelity: fidelity.CheckMachine(os.DirFS("/sys"), m)}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// requireNamespace skips unless this test can mount in a namespace and
// run lspci and lstopo-no-graphics.
func requireNamespace(t *testing.T) {
	t.Helper()
	overlaytest.RequireRoot(t)
	overlaytest.RequireProgram(t, "unshare", "util-linux")
	overlaytest.RequireProgram(t, "lspci", "pciutils")
	overlaytest.RequireProgram(t, "lstopo-no-graphics", "hwloc-nox")
}

// inNamespace runs a shell script with the overlay served as a container
// sees it (hosttest.Served).
func inNamespace(t *testing.T, root, script string, env ...string) string {
	t.Helper()
	stdout, stderr, err := hosttest.Served{Root: root, Env: env}.Shell(script)
	require.NoError(t, err, "script:\n%s\nstderr:\n%s", script, stderr)
	return stdout
}

// consumersInNamespace starts this test binary inside the namespace to run
// the consumer libraries there.
func consumersInNamespace(t *testing.T, root string) consumerResult {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := hosttest.Served{Root: root}.Reexec(t, consumersMode)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "stderr:\n%s", stderr.String())
	var r consumerResult
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &r), stdout.String())
	return r
}

// render returns a profile rendered with the real render path, shared
// with the other tests that ask for the same: the caller must not change it.
func render(t *testing.T, opts overlay.Options) (string, *plan.Plan) {
	t.Helper()
	return trees.Render(t, opts)
}

// profileCase is a built-in under its own hierarchy or a forced one.
type profileCase struct {
	name      string
	hierarchy boards.Hierarchy
}

func (c profileCase) String() string {
	if c.hierarchy == "" {
		return c.name
	}
	return c.name + "/" + string(c.hierarchy)
}

// allCases is every built-in under its own hierarchy and each forced one
// its bus numbers allow.
func allCases(t *testing.T) []profileCase {
	t.Helper()
	var out []profileCase
	for _, name := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm"} {
		for _, h := range append([]boards.Hierarchy{""}, boards.Hierarchies()...) {
			if _, err := overlay.LoadMachine(name, h); err != nil {
				continue // t4's GPUs sit on the root bus: only flat
			}
			out = append(out, profileCase{name, h})
		}
	}
	return out
}

func lines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }
