package cdispec

import (
	"io/fs"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

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
