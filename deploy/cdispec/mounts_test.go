package cdispec

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func TestMounts(t *testing.T) {
	opts := []string{"ro", "nosuid", "nodev", "bind"}
	tests := []struct {
		name      string
		root, ctr string
		alsoAt    []string
		want      []Mount
		wantErr   string
	}{
		{
			name: "default container root",
			root: "/var/lib/nvml-mock",
			want: []Mount{
				{Source: "/var/lib/nvml-mock", Destination: "/opt/nvml-mock", Options: opts},
				{Source: "/var/lib/nvml-mock/sys/bus/pci/devices", Destination: "/sys/bus/pci/devices", Options: opts},
				{Source: "/var/lib/nvml-mock/sys/module", Destination: "/sys/module", Options: opts},
				{Source: "/sys/module", Destination: "/opt/nvml-mock/host-sys/module", Options: opts},
			},
		},
		{
			name: "also at the node-feature-discovery path",
			root: "/srv/mock", ctr: "/usr/local/mock", alsoAt: []string{"/host-sys/bus/pci/devices"},
			want: []Mount{
				{Source: "/srv/mock", Destination: "/usr/local/mock", Options: opts},
				{Source: "/srv/mock/sys/bus/pci/devices", Destination: "/sys/bus/pci/devices", Options: opts},
				{Source: "/srv/mock/sys/bus/pci/devices", Destination: "/host-sys/bus/pci/devices", Options: opts},
				{Source: "/srv/mock/sys/module", Destination: "/sys/module", Options: opts},
				{Source: "/srv/mock/sys/module", Destination: "/host-sys/module", Options: opts},
				{Source: "/sys/module", Destination: "/usr/local/mock/host-sys/module", Options: opts},
			},
		},
		{name: "too deep", root: "/r", alsoAt: []string{"/host/sys/bus/pci/devices"}, wantErr: "is 5 levels deep"},
		{name: "too shallow", root: "/r", alsoAt: []string{"/host-pci/devices"}, wantErr: "is 2 levels deep"},
		{name: "relative", root: "/r", alsoAt: []string{"host-sys/bus/pci/devices"}, wantErr: "absolute"},
		{name: "unclean", root: "/r", alsoAt: []string{"/host-sys/bus/pci/devices/"}, wantErr: "clean"},
		{name: "twice", root: "/r", alsoAt: []string{"/sys/bus/pci/devices"}, wantErr: "already a mount target"},
		{name: "inside the container root", root: "/r", alsoAt: []string{"/opt/nvml-mock/pci/devices"}, wantErr: "inside the container root"},
		{name: "relative root", root: "var/lib/nvml-mock", wantErr: "absolute"},
		{name: "container root at /sys", root: "/r", ctr: "/sys/mock", wantErr: "/sys"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Mounts(tc.root, tc.ctr, tc.alsoAt)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func TestCheckRendered(t *testing.T) {
	root := filepath.Join(t.TempDir(), "overlay")
	require.ErrorContains(t, CheckRendered(os.DirFS(root), root), "holds no complete render", "nothing rendered yet")

	_, _, err := overlay.Render(overlay.Options{Profile: "t4-vm", Root: root})
	require.NoError(t, err)
	require.NoError(t, CheckRendered(os.DirFS(root), root), "a complete render")

	// A render under way withdraws the marker first; so does this.
	require.NoError(t, os.Remove(filepath.Join(root, writer.MarkerFile)))
	require.ErrorContains(t, CheckRendered(os.DirFS(root), root), "no completion marker")
}

// The mounts must put the overlay where the render's links point: a render
// for /opt/other served at /opt/nvml-mock fails most checks in the
// container, so the render's own container root wins and a conflicting
// flag is refused.
func TestServedContainerRoot(t *testing.T) {
	root := filepath.Join(t.TempDir(), "overlay")
	got, err := ServedContainerRoot(os.DirFS(root), root, "")
	require.NoError(t, err)
	require.Equal(t, "/opt/nvml-mock", got, "nothing rendered: the default")
	got, err = ServedContainerRoot(os.DirFS(root), root, "/opt/x")
	require.NoError(t, err)
	require.Equal(t, "/opt/x", got, "nothing rendered: the flag")

	_, _, err = overlay.Render(overlay.Options{Profile: "t4-vm", Root: root, ContainerRoot: "/opt/other"})
	require.NoError(t, err)
	for _, flag := range []string{"", "/opt/other"} {
		got, err = ServedContainerRoot(os.DirFS(root), root, flag)
		require.NoError(t, err)
		require.Equal(t, "/opt/other", got, "flag %q", flag)
	}
	_, err = ServedContainerRoot(os.DirFS(root), root, "/opt/nvml-mock")
	require.EqualError(t, err, "/opt/nvml-mock: the render at "+root+" was made for /opt/other, and its links point there")
}

// A refused links target names the target, and leaves to the caller where
// it came from (the command line's --also-at).
func TestTargetErrorNamesTheTarget(t *testing.T) {
	for _, target := range []string{"/host/sys/bus/pci/devices", "relative", "/sys/bus/pci/devices", "/opt/nvml-mock/pci/devices"} {
		_, err := Mounts("/r", "", []string{target})
		var te *TargetError
		require.ErrorAs(t, err, &te, target)
		require.Equal(t, target, te.Target)
		require.EqualError(t, err, fmt.Sprintf("links target %q: %v", target, te.Err))
		require.NotContains(t, err.Error(), "--", "a library error names no flag")
	}
}

// TestWritableMounts: the writable mode's mounts are the read-only set's,
// the overlay root writable, plus the drivers directory, drivers_probe and
// the node's own drivers and devices for the links to them.
func TestWritableMounts(t *testing.T) {
	ro := []string{"ro", "nosuid", "nodev", "bind"}
	rw := []string{"rw", "nosuid", "nodev", "bind"}
	got, err := WritableMounts("/var/lib/nvml-mock", "", []string{"/host-sys/bus/pci/devices"}, "", "6.18.0")
	require.NoError(t, err)
	require.Equal(t, []Mount{
		{Source: "/var/lib/nvml-mock", Destination: "/opt/nvml-mock", Options: rw},
		{Source: "/var/lib/nvml-mock/sys/bus/pci/devices", Destination: "/sys/bus/pci/devices", Options: ro},
		{Source: "/var/lib/nvml-mock/sys/bus/pci/devices", Destination: "/host-sys/bus/pci/devices", Options: ro},
		{Source: "/var/lib/nvml-mock/sys/module", Destination: "/sys/module", Options: ro},
		{Source: "/var/lib/nvml-mock/sys/module", Destination: "/host-sys/module", Options: ro},
		{Source: "/sys/module", Destination: "/opt/nvml-mock/host-sys/module", Options: ro},
		{Source: "/var/lib/nvml-mock/lib/modules.alias", Destination: "/lib/modules/6.18.0/modules.alias", Options: ro},
		{Source: "/var/lib/nvml-mock/sys/bus/pci/drivers", Destination: "/sys/bus/pci/drivers", Options: rw},
		{Source: "/var/lib/nvml-mock/sys/bus/pci/drivers_probe", Destination: "/sys/bus/pci/drivers_probe", Options: rw},
		{Source: "/sys/bus/pci/drivers", Destination: "/opt/nvml-mock/host-sys/bus/pci/drivers", Options: ro},
		{Source: "/sys/devices", Destination: "/opt/nvml-mock/host-sys/devices", Options: ro},
	}, got)
	_, err = WritableMounts("/var/lib/nvml-mock", "", []string{"/x"}, "", "")
	require.ErrorContains(t, err, `links target "/x"`)
	_, err = WritableMounts("/var/lib/nvml-mock", "", nil, "", "../x")
	require.ErrorContains(t, err, `kernel release "../x"`)
}
