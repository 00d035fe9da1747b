package hosttest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func TestMain(m *testing.M) { os.Exit(overlaytest.Main(m)) }

// Served's mounts under a top-level directory the host lacks (as
// node-feature-discovery's /host-sys) exist inside the namespace and leave
// nothing on the host. Negative control: the host's root is listed before
// and after, and the old script (a mkdir at the host's root) fails here.
func TestServedCreatesNothingOnTheHost(t *testing.T) {
	overlaytest.RequireRoot(t)
	hostSys := "/nvml-mock-sysfs-served-test-host-sys"
	links := "/nvml-mock-sysfs-served-test-links/bus/pci/devices"
	for _, top := range []string{hostSys, topDir(links)} {
		_, err := os.Lstat(top)
		require.True(t, os.IsNotExist(err), "%s exists on the host before the test", top)
	}
	before := rootNames(t)

	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, plan.LinksDir, "0000:01:00.0"), 0o755))
	wd := t.TempDir()
	s := Served{Root: root, HostSysAt: []string{hostSys}, LinksAt: []string{"/" + plan.LinksDir, hostSys + "/bus/pci/devices", links}}
	cmd := s.Command("sh", "-c", `pwd; ls "$1"; ls "$2"; ls "$3"; cat /proc/self/mountinfo | wc -l`, "sh", hostSys+"/bus/pci/devices", links, "/"+plan.LinksDir)
	cmd.Dir = wd
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s\nscript:\n%s", out, s.Script())
	lines := strings.Split(string(out), "\n")
	require.Equal(t, wd, lines[0], "the command runs in its own working directory")
	require.Equal(t, []string{"0000:01:00.0", "0000:01:00.0", "0000:01:00.0"}, lines[1:4], "the links directory at each target")

	// The node's own /opt stays visible when no overlay hides it.
	hostOpt, err := os.ReadDir("/opt")
	require.NoError(t, err)
	var want []string
	for _, e := range hostOpt {
		want = append(want, e.Name())
	}
	got := Served{HostSysAt: []string{hostSys}}.Run(t, "ls", "-A", "/opt")
	require.Equal(t, strings.Join(want, "\n"), strings.TrimSpace(got), "/opt in a private root without an overlay")

	after := rootNames(t)
	require.Equal(t, before, after, "Served created these in the host's root")
}

// rootNames lists the names in the host's root directory.
func rootNames(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir("/")
	require.NoError(t, err)
	names := make([]string, len(entries))
	for i, e := range entries {
		names[i] = e.Name()
	}
	return names
}
