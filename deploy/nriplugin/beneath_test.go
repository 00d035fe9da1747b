package nriplugin

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/runtime-tools/generate"
	rspec "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// hostPath is a pod's hostPath volume as containerd's CRI mounts it.
func hostPath(src, dst string) *api.Mount {
	return &api.Mount{Destination: dst, Source: src, Type: "bind", Options: []string{"rbind", "rprivate", "ro"}}
}

// TestBeneathTheNodesMounts: a served container that mounts the node's /
// (the DRA driver's chart, at /host-root) or /sys (nfd-worker's, at
// /host-sys) gets the module view and the tree's groups beneath it, as
// cdispec.Beneath decides, after that mount; a container not served gets
// nothing.
func TestBeneathTheNodesMounts(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	beneath := cdispec.Beneath{Root: "/var/lib/nvml-mock-sysfs", TreeGroups: true}
	runPlugin(t, Options{Socket: sock, Edits: served(t).Edits, Beneath: func() cdispec.Beneath { return beneath }})
	opts := []string{"ro", "nosuid", "nodev", "bind"}
	added := func(adjust *api.ContainerAdjustment) []*api.Mount { return adjust.GetMounts()[4:] }

	hostRoot := hostPath("/", "/host-root")
	adjust, err := r.create(t, pod("nvidia-dra-driver-gpu", nil, nil), &api.Container{Id: "dra", Name: "plugin", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Equal(t, []*api.Mount{
		{Destination: "/host-root/sys/module", Source: "/var/lib/nvml-mock-sysfs/sys/module", Options: opts},
		{Destination: "/host-root/sys/kernel", Source: "/var/lib/nvml-mock-sysfs/sys/kernel", Options: opts},
	}, added(adjust), "a node without iommu groups: the tree's sys/kernel")
	g := &ociMounts{spec: &rspec.Spec{Mounts: []rspec.Mount{{Destination: hostRoot.Destination, Source: hostRoot.Source, Type: "bind", Options: hostRoot.Options}}}}
	require.NoError(t, generate.SpecGenerator(g).AdjustMounts(adjust.GetMounts()))
	require.Equal(t, "/host-root", g.spec.Mounts[0].Destination, "the node's / first, ours beneath it after")

	beneath.NodeGroups = true
	adjust, err = r.create(t, pod("nvidia-dra-driver-gpu", nil, nil), &api.Container{Id: "dra-groups", Name: "plugin", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Equal(t, "/host-root/sys/kernel/iommu_groups", added(adjust)[1].GetDestination(), "a node with them: the groups alone")

	adjust, err = r.create(t, pod("node-feature-discovery", nil, nil), &api.Container{Id: "nfd", Name: "worker", Mounts: []*api.Mount{hostPath("/sys", "/host-sys")}})
	require.NoError(t, err)
	require.Equal(t, []*api.Mount{
		{Destination: "/host-sys/module", Source: "/var/lib/nvml-mock-sysfs/sys/module", Options: opts},
		{Destination: "/host-sys/kernel/iommu_groups", Source: "/var/lib/nvml-mock-sysfs/sys/kernel/iommu_groups", Options: opts},
	}, added(adjust))

	adjust, err = r.create(t, pod("kube-system", nil, nil), &api.Container{Id: "system", Name: "c", Mounts: []*api.Mount{hostRoot}})
	require.NoError(t, err)
	require.Empty(t, adjust.GetMounts(), "not served: nothing beneath either")
}

// TestHooksThroughTheEdits: the edits' hooks (cdispec.ProcHook) reach the
// container as NRI's, so the NRI path and the CDI spec carry the same.
func TestHooksThroughTheEdits(t *testing.T) {
	sock := socket(t)
	r := startRuntime(t, sock, nil, nil)
	mounts, err := cdispec.Mounts("/var/lib/nvml-mock-sysfs", "", nil)
	require.NoError(t, err)
	timeout := 5
	hook := cdispec.ProcHook("/var/lib/nvml-mock-sysfs-hook/nvml-mock-sysfs", "/var/lib/nvml-mock-sysfs")
	other := &specs.Hook{HookName: "poststop", Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=1"}, Timeout: &timeout}
	tr := &tree{edits: cdispec.DeviceEdits(mounts, nil, hook, other)}
	startPlugin(t, sock, tr, Policy{})
	adjust, err := r.create(t, pod("default", nil, nil), &api.Container{Id: "c1", Name: "gfd"})
	require.NoError(t, err)
	require.Equal(t, []*api.Hook{{Path: hook.Path, Args: hook.Args}}, adjust.GetHooks().GetCreateContainer())
	require.Equal(t, []*api.Hook{{Path: "/bin/true", Args: []string{"true"}, Env: []string{"A=1"}, Timeout: api.Int(5)}}, adjust.GetHooks().GetPoststop())
	require.Empty(t, adjust.GetHooks().GetPrestart())

	adjust, err = r.create(t, pod("kube-system", nil, nil), &api.Container{Id: "c2", Name: "coredns"})
	require.NoError(t, err)
	require.Empty(t, adjust.GetHooks().GetCreateContainer(), "not served: no hook")
}
