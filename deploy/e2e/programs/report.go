package programs

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
)

// SabotageEnv names the variable that breaks the end-to-end suites' tree
// runs on purpose: make e2e (or e2e-k8s) E2E_SABOTAGE=escaped or no-tree
// must turn them red.
const (
	SabotageEnv     = "NVML_MOCK_SYSFS_E2E_SABOTAGE"
	SabotageEscaped = "escaped" // the tree runs get plainly escaped links
	SabotageNoTree  = "no-tree" // the tree runs get no tree at all
)

// Sabotage returns the sabotage SabotageEnv asks for, "" for none, and
// says in the test's log that the tree runs must fail; a value it does
// not know fails the test.
func Sabotage(t testing.TB) string {
	t.Helper()
	s := os.Getenv(SabotageEnv)
	switch s {
	case "":
	case SabotageEscaped, SabotageNoTree:
		t.Logf("%s=%s: the tree runs are broken on purpose and must fail", SabotageEnv, s)
	default:
		t.Fatalf("%s=%q: want %s or %s", SabotageEnv, s, SabotageEscaped, SabotageNoTree)
	}
	return s
}

// SabotagedRoot returns the tree a sabotaged run serves in place of the
// rendered root, and the flags its CDI spec is written with (nvml-mock-sysfs
// cdi): root itself without sabotage; a copy with plainly escaped links
// (SabotageEscaped, hosttest.PlainLinksCopy); or an empty directory
// whose spec is written with --fail-open, as serve writes one before its
// first render: the device with no mounts (SabotageNoTree).
func SabotagedRoot(t testing.TB, sabotage, root string) (string, []string) {
	t.Helper()
	switch sabotage {
	case SabotageEscaped:
		return hosttest.PlainLinksCopy(t, root), nil
	case SabotageNoTree:
		empty := filepath.Join(t.TempDir(), "no-tree")
		if err := os.Mkdir(empty, 0o755); err != nil {
			t.Fatal(err)
		}
		return empty, []string{"--fail-open"}
	}
	return root, nil
}

// WriteReport writes a suite's matrix to the file the variable env names,
// which make prints (go test shows a passing package's output only with
// -v), else straight to standard output: t.Log would indent it.
func WriteReport(t testing.TB, env string, report []byte) {
	t.Helper()
	if file := os.Getenv(env); file != "" {
		if err := os.WriteFile(file, report, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	os.Stdout.Write(report)
}
