// Package testenv holds what several packages' tests share: finding the
// project's ../shared test data, rendering a machine into a temporary
// overlay, and the checks end-to-end tests make before they use real
// programs. Only tests import it.
package testenv

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// ModuleRoot is the directory holding go.mod, found from the test's
// working directory (its package directory).
func ModuleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	require.NoError(t, err)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		require.NotEqual(t, parent, dir, "no go.mod above the test's directory")
		dir = parent
	}
}

// SharedTestdata returns ../shared/testdata/<sub> beside the repository, and
// skips the test when it is absent, as in a user's clone.
func SharedTestdata(t testing.TB, sub string) string {
	t.Helper()
	dir := filepath.Join(filepath.Dir(ModuleRoot(t)), "shared", "testdata", sub)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("../shared/testdata/%s is absent (a clone without the project's shared folder): %v", sub, err)
	}
	return dir
}

// Render plans a machine and writes it into a new temporary overlay root.
func Render(t testing.TB, m *profile.Machine, opts plan.Options) (string, *plan.Plan) {
	t.Helper()
	p, err := plan.New(m, opts)
	require.NoError(t, err)
	root := t.TempDir()
	_, err = writer.Apply(root, p, writer.Options{})
	require.NoError(t, err)
	return root, p
}

// RequireRoot skips a test that needs root (mount namespaces, bind mounts).
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for a private mount namespace and bind mounts; CI runs as root")
	}
}

// RequireProgram returns a program's path, or skips the test saying which
// package installs it (make deps does, as root).
func RequireProgram(t testing.TB, name, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (Debian package %s; make deps installs it as root): %v", name, debianPackage, err)
	}
	return p
}
