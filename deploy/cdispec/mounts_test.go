package cdispec

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
	"testing/fstest"

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

func TestBeneathMounts(t *testing.T) {
	ro := []string{"ro", "nosuid", "nodev", "bind"}
	hostPath := func(src, dst string, opts ...string) Mount {
		return Mount{Source: src, Destination: dst, Options: append([]string{"rbind", "rprivate"}, opts...)}
	}
	served := []string{"/opt/nvml-mock-sysfs", "/sys/bus/pci/devices", "/host-sys/bus/pci/devices", "/sys/module", "/host-sys/module"}
	groups := Beneath{Root: "/r", TreeGroups: true, NodeGroups: true}
	noNodeGroups := Beneath{Root: "/r", TreeGroups: true}
	tests := []struct {
		name    string
		beneath Beneath
		ctr     []Mount
		served  []string
		want    []Mount
	}{
		{
			name:    "the DRA driver's / at /host-root, on a node with iommu groups",
			beneath: groups, ctr: []Mount{hostPath("/", "/host-root")},
			want: []Mount{
				{Source: "/r/sys/module", Destination: "/host-root/sys/module", Options: ro},
				{Source: "/r/sys/kernel/iommu_groups", Destination: "/host-root/sys/kernel/iommu_groups", Options: ro},
			},
		},
		{
			name:    "the DRA driver's / at /host-root, on a node without: the tree's sys/kernel",
			beneath: noNodeGroups, ctr: []Mount{hostPath("/", "/host-root/", "ro")},
			want: []Mount{
				{Source: "/r/sys/module", Destination: "/host-root/sys/module", Options: ro},
				{Source: "/r/sys/kernel", Destination: "/host-root/sys/kernel", Options: ro},
			},
		},
		{
			name:    "a tree without groups: the module view alone",
			beneath: Beneath{Root: "/r", NodeGroups: true}, ctr: []Mount{hostPath("/", "/host-root")},
			want: []Mount{{Source: "/r/sys/module", Destination: "/host-root/sys/module", Options: ro}},
		},
		{
			name:    "nfd-worker's /sys at /host-sys, not served at /host-sys/module yet",
			beneath: groups, ctr: []Mount{hostPath("/sys", "/host-sys")},
			want: []Mount{
				{Source: "/r/sys/module", Destination: "/host-sys/module", Options: ro},
				{Source: "/r/sys/kernel/iommu_groups", Destination: "/host-sys/kernel/iommu_groups", Options: ro},
			},
		},
		{
			name:    "nfd-worker's /sys at /host-sys, served there by --also-at",
			beneath: noNodeGroups, ctr: []Mount{hostPath("/sys", "/host-sys")}, served: served,
			want: []Mount{{Source: "/r/sys/kernel", Destination: "/host-sys/kernel", Options: ro}},
		},
		{
			name:    "a plain bind of /sys",
			beneath: Beneath{Root: "/r"}, ctr: []Mount{{Source: "/sys", Destination: "/node/sys", Options: []string{"bind", "ro"}}},
			want: []Mount{{Source: "/r/sys/module", Destination: "/node/sys/module", Options: ro}},
		},
		{name: "the node's /sys at /sys: served already", beneath: groups, ctr: []Mount{hostPath("/sys", "/sys")}},
		{name: "the node's / at /", beneath: groups, ctr: []Mount{hostPath("/", "/")}},
		{
			name: "a plain bind of /: its /sys is the root filesystem's", beneath: groups,
			ctr: []Mount{{Source: "/", Destination: "/host-root", Options: []string{"bind", "ro"}}},
		},
		{
			name: "Bidirectional: ours would reach the node's /sys", beneath: groups,
			ctr: []Mount{hostPath("/", "/host-root", "rshared"), hostPath("/sys", "/host-sys", "shared")},
		},
		{name: "not a bind", beneath: groups, ctr: []Mount{{Source: "sysfs", Destination: "/host-sys", Options: []string{"ro"}}}},
		{name: "another directory of the node", beneath: groups, ctr: []Mount{hostPath("/var/lib", "/host-var")}},
		{
			name: "the container mounts a stand-in there itself", beneath: groups,
			ctr:  []Mount{hostPath("/", "/host-root"), hostPath("/tmp/standin", "/host-root/sys/module/vfio_pci"), hostPath("/tmp/groups", "/host-root/sys/kernel/iommu_groups")},
			want: []Mount{{Source: "/r/sys/module", Destination: "/host-root/sys/module", Options: ro}},
		},
		{
			name: "both, and twice the same", beneath: noNodeGroups,
			ctr: []Mount{hostPath("/", "/host-root"), hostPath("/sys", "/host-sys"), hostPath("/sys", "/host-sys")},
			want: []Mount{
				{Source: "/r/sys/module", Destination: "/host-root/sys/module", Options: ro},
				{Source: "/r/sys/kernel", Destination: "/host-root/sys/kernel", Options: ro},
				{Source: "/r/sys/module", Destination: "/host-sys/module", Options: ro},
				{Source: "/r/sys/kernel", Destination: "/host-sys/kernel", Options: ro},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.beneath.Mounts(tc.ctr, tc.served))
		})
	}
}

func TestNewBeneath(t *testing.T) {
	tree := fstest.MapFS{"sys/kernel/iommu_groups/0/type": {Data: []byte("DMA\n")}}
	node := fstest.MapFS{"kernel/iommu_groups": {Mode: fs.ModeDir | 0o755}}
	require.Equal(t, Beneath{Root: "/r", TreeGroups: true, NodeGroups: true}, NewBeneath("/r", tree, node))
	empty := fstest.MapFS{"sys/kernel/iommu_groups": {Mode: fs.ModeDir | 0o755}}
	require.Equal(t, Beneath{Root: "/r"}, NewBeneath("/r", empty, fstest.MapFS{"kernel/mm": {Mode: fs.ModeDir | 0o755}}), "an empty groups directory is none; a node without one has none")
}
