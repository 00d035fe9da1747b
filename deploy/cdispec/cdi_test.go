package cdispec

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func testMounts(t *testing.T, alsoAt ...string) []Mount {
	t.Helper()
	ms, err := Mounts("/var/lib/nvml-mock", "", alsoAt)
	require.NoError(t, err)
	return ms
}

func TestNewSpecVersionIsTheLowestTheContentNeeds(t *testing.T) {
	tests := []struct {
		name, kind string
		mounts     []Mount
		want       string
	}{
		{name: "mounts without a type", kind: DefaultKind, mounts: testMounts(t), want: "0.3.0"},
		{name: "fail-open: no mounts", kind: DefaultKind, want: "0.3.0"},
		// A dot in the class arrived with 0.6.0; the version follows the content.
		{name: "dotted class", kind: "mock.nvidia.com/pci.sysfs", mounts: testMounts(t), want: "0.6.0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSpec(tc.kind, tc.mounts, nil)
			require.NoError(t, err)
			require.Equal(t, tc.want, s.Version)
			require.NoError(t, specs.ValidateVersion(s))
		})
	}
}

func TestNewSpecCarriesTheMountSet(t *testing.T) {
	ms := testMounts(t, "/host-sys/bus/pci/devices")
	s, err := NewSpec(DefaultKind, ms, nil)
	require.NoError(t, err)
	require.Equal(t, DefaultKind, s.Kind)
	require.Len(t, s.Devices, 1)
	dev := s.Devices[0]
	require.Equal(t, DeviceName, dev.Name)
	require.Equal(t, []string{StateEnv + "=mounted"}, dev.ContainerEdits.Env)
	require.Len(t, dev.ContainerEdits.Mounts, len(ms))
	for i, m := range ms {
		got := dev.ContainerEdits.Mounts[i]
		require.Equal(t, specs.Mount{HostPath: m.Source, ContainerPath: m.Destination, Options: []string{"ro", "nosuid", "nodev", "bind"}}, *got)
	}

	open, err := NewSpec(DefaultKind, nil, nil)
	require.NoError(t, err)
	require.Empty(t, open.Devices[0].ContainerEdits.Mounts, "fail-open writes no mounts")
	require.Equal(t, []string{StateEnv + "=unrendered"}, open.Devices[0].ContainerEdits.Env)
}

func TestNewSpecRefusesABadKind(t *testing.T) {
	for _, kind := range []string{"pcisysfs", "mock.nvidia.com/", "1mock.com/pcisysfs", "mock.nvidia.com/pci sysfs"} {
		_, err := NewSpec(kind, nil, nil)
		require.Error(t, err, kind)
	}
}

func TestWriteSpecRoundTripsThroughTheCDILibrary(t *testing.T) {
	for _, ext := range []string{".yaml", ".json"} {
		t.Run(ext, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "mock"+ext)
			s, err := NewSpec(DefaultKind, testMounts(t), nil)
			require.NoError(t, err)
			wrote, err := WriteSpec(file, s)
			require.NoError(t, err)
			require.True(t, wrote)

			read, err := cdi.ReadSpec(file, 0)
			require.NoError(t, err)
			require.Equal(t, s, read.Spec)
			require.NotNil(t, read.GetDevice(DeviceName))
			st, err := os.Stat(file)
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o644), st.Mode().Perm())

			wrote, err = WriteSpec(file, s)
			require.NoError(t, err)
			require.False(t, wrote, "the same spec again writes nothing")
		})
	}
}

func TestWriteSpecRefusesWhatTheCDILibraryRefuses(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "mock.yaml")
	require.NoError(t, os.WriteFile(file, []byte("previous content\n"), 0o600))
	bad := []*specs.Spec{
		// A device with no edits.
		{Version: "0.3.0", Kind: DefaultKind, Devices: []specs.Device{{Name: DeviceName}}},
		// A mount with no host path.
		{Version: "0.3.0", Kind: DefaultKind, Devices: []specs.Device{{Name: DeviceName, ContainerEdits: specs.ContainerEdits{Mounts: []*specs.Mount{{ContainerPath: "/x"}}}}}},
		// A version older than the content.
		{Version: "0.3.0", Kind: "mock.nvidia.com/pci.sysfs", Devices: []specs.Device{{Name: DeviceName, ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}}}}},
	}
	for _, s := range bad {
		wrote, err := WriteSpec(file, s)
		require.ErrorContains(t, err, "the CDI library rejects")
		require.NotContains(t, err.Error(), dir+"/.", "the pending file's name means nothing to the user")
		require.False(t, wrote)
		b, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, "previous content\n", string(b), "the file is left as it was")
	}
	left, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Len(t, left, 1, "no pending file is left behind")
}

// A fresh node may lack the CDI directory: WriteSpec creates it, and where
// it cannot, it names the directory, never its pending file.
func TestWriteSpecIntoAMissingDirectory(t *testing.T) {
	s, err := NewSpec(DefaultKind, testMounts(t), nil)
	require.NoError(t, err)
	dir := filepath.Join(t.TempDir(), "run", "cdi")
	file := filepath.Join(dir, "mock.yaml")
	wrote, err := WriteSpec(file, s)
	require.NoError(t, err)
	require.True(t, wrote)
	st, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), st.Mode().Perm())

	blocker := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	_, err = WriteSpec(filepath.Join(blocker, "cdi", "mock.yaml"), s)
	require.EqualError(t, err, "write "+blocker+"/cdi/mock.yaml: create its directory "+blocker+"/cdi: mkdir "+blocker+": not a directory")
}

func readFixture(t *testing.T) *specs.Spec {
	t.Helper()
	s, err := ReadSpec("testdata/nvidia.yaml")
	require.NoError(t, err)
	return s
}

func containerPaths(ms []*specs.Mount) []string {
	var vs []specs.Mount
	for _, m := range ms {
		vs = append(vs, *m)
	}
	return containerPathsOf(vs)
}

func TestMerge(t *testing.T) {
	ours := testMounts(t, "/host-sys/bus/pci/devices")
	orig := readFixture(t)
	s := readFixture(t)
	r := Merge(s, ours, nil, true)

	require.Equal(t, []string{
		"/usr/lib64/libnvidia-ml.so.550.163.01",
		"/opt/nvml-mock", "/sys/bus/pci/devices", "/host-sys/bus/pci/devices",
		"/sys/module", "/host-sys/module", "/opt/nvml-mock/host-sys/module",
	}, containerPaths(s.ContainerEdits.Mounts), "the library mount stays, ours are appended")
	require.ElementsMatch(t, []string{"/sys/devices", "/opt/nvml-mock", "/sys/devices/"}, containerPathsOf(r.Removed),
		"the whole-devices mounts (top level and device all) and the older copy of ours go")
	require.Len(t, r.Added, len(ours))
	require.Empty(t, s.Devices[1].ContainerEdits.Mounts)

	// Everything else is as it was.
	require.Equal(t, orig.Version, s.Version)
	require.Equal(t, orig.Kind, s.Kind)
	require.Equal(t, orig.ContainerEdits.Env, s.ContainerEdits.Env)
	require.Equal(t, orig.ContainerEdits.Hooks, s.ContainerEdits.Hooks)
	require.Equal(t, orig.ContainerEdits.DeviceNodes, s.ContainerEdits.DeviceNodes)
	require.Equal(t, orig.Devices[0], s.Devices[0])
	require.Equal(t, orig.Devices[1].ContainerEdits.DeviceNodes, s.Devices[1].ContainerEdits.DeviceNodes)

	// Merging again changes nothing.
	again := readFixture(t)
	Merge(again, ours, nil, true)
	Merge(again, ours, nil, true)
	require.Equal(t, s, again)
}

func containerPathsOf(ms []specs.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ContainerPath)
	}
	return out
}

func TestMergeFailOpenRemovesOnlyOurs(t *testing.T) {
	s := readFixture(t)
	r := Merge(s, testMounts(t), nil, false)
	require.Empty(t, r.Added)
	require.Equal(t, []string{"/opt/nvml-mock"}, containerPathsOf(r.Removed), "only the older copy of ours goes")
	require.True(t, slices.Contains(containerPaths(s.ContainerEdits.Mounts), "/sys/devices"), "the whole-devices mount keeps serving")
}

func TestMergeIntoFileIsIdempotent(t *testing.T) {
	file := filepath.Join(t.TempDir(), "nvidia.yaml")
	b, err := os.ReadFile("testdata/nvidia.yaml")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, b, 0o600))
	merge := func() bool {
		s, err := ReadSpec(file)
		require.NoError(t, err)
		Merge(s, testMounts(t), nil, true)
		wrote, err := WriteSpec(file, s)
		require.NoError(t, err)
		return wrote
	}
	require.True(t, merge())
	first, err := os.ReadFile(file)
	require.NoError(t, err)
	require.False(t, merge(), "a second merge writes nothing")
	second, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(first), string(second))
	st, err := os.Stat(file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), st.Mode().Perm(), "the file keeps its permissions")
}

// GFD's machine-type file reaches every served container through the spec
// (issue 25): Env names it where the render wrote one, the standalone
// spec's device and a merged spec's top-level edits carry it, a merge
// replaces older copies and keeps the spec's own variables, and a root
// without the file gets no variable.
func TestMachineTypeFileEnv(t *testing.T) {
	root := t.TempDir()
	require.Empty(t, Env(os.DirFS(root), plan.DefaultContainerRoot), "no machine-type file, no variable")
	require.NoError(t, os.MkdirAll(filepath.Join(root, "dmi"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, plan.ProductNameFile), []byte("DGX B200\n"), 0o644))
	env := Env(os.DirFS(root), "/opt/x")
	require.Equal(t, []string{"GFD_MACHINE_TYPE_FILE=/opt/x/dmi/product_name"}, env)

	s, err := NewSpec(DefaultKind, testMounts(t), env)
	require.NoError(t, err)
	require.Equal(t, []string{StateEnv + "=mounted", env[0]}, s.Devices[0].ContainerEdits.Env)
	require.Equal(t, "0.3.0", s.Version, "variables need no newer cdiVersion than mounts")
	open, err := NewSpec(DefaultKind, nil, env)
	require.NoError(t, err)
	require.Equal(t, []string{StateEnv + "=unrendered"}, open.Devices[0].ContainerEdits.Env, "--fail-open serves no variable")

	other := &specs.Spec{Version: "0.5.0", Kind: "vendor.com/gpu", Devices: []specs.Device{{Name: "0",
		ContainerEdits: specs.ContainerEdits{Env: []string{"GFD_MACHINE_TYPE_FILE=/old"}}}},
		ContainerEdits: specs.ContainerEdits{Env: []string{"A=1", "GFD_MACHINE_TYPE_FILE=/older"}}}
	r := Merge(other, testMounts(t), env, true)
	require.Equal(t, env, r.Env)
	require.Equal(t, []string{"A=1", env[0]}, other.ContainerEdits.Env)
	require.Empty(t, other.Devices[0].ContainerEdits.Env)
	Merge(other, testMounts(t), nil, true)
	require.Equal(t, []string{"A=1"}, other.ContainerEdits.Env, "a render without a machine type takes the variable away")
}

// The hook that serves the tree's /proc files rides the same edits: the
// standalone spec carries it at a cdiVersion podman 4.3 takes, an
// unrendered root gets none, and a merge replaces older copies of it
// wherever they are and keeps other hooks.
func TestProcHook(t *testing.T) {
	hook := ProcHook("/var/lib/hook/nvml-mock-sysfs", "/var/lib/nvml-mock-sysfs")
	require.Equal(t, &specs.Hook{HookName: "createContainer", Path: "/var/lib/hook/nvml-mock-sysfs",
		Args: []string{"/var/lib/hook/nvml-mock-sysfs", "proc-hook", "--root", "/var/lib/nvml-mock-sysfs", "--failures", "/var/lib/hook/proc-hook-failures"}}, hook)

	file := filepath.Join(t.TempDir(), "mock.yaml")
	s, _, err := WriteStandalone(file, DefaultKind, testMounts(t), nil, true, hook)
	require.NoError(t, err)
	require.Equal(t, []*specs.Hook{hook}, s.Devices[0].ContainerEdits.Hooks)
	require.Equal(t, "0.3.0", s.Version, "hooks need no newer cdiVersion than mounts; podman 4.3 takes up to 0.5.0")
	read, err := ReadSpec(file)
	require.NoError(t, err)
	require.Equal(t, s, read, "the CDI library takes the hook")
	open, err := NewSpec(DefaultKind, nil, nil, hook)
	require.NoError(t, err)
	require.Empty(t, open.Devices[0].ContainerEdits.Hooks, "--fail-open serves no hook: it needs the tree")

	theirs := &specs.Hook{HookName: "createContainer", Path: "/usr/bin/nvidia-cdi-hook", Args: []string{"nvidia-cdi-hook", "update-ldcache"}}
	old := ProcHook("/old/nvml-mock-sysfs", "/old/root")
	other := &specs.Spec{Version: "0.5.0", Kind: "nvidia.com/gpu",
		Devices:        []specs.Device{{Name: "0", ContainerEdits: specs.ContainerEdits{Env: []string{"A=1"}, Hooks: []*specs.Hook{old}}}},
		ContainerEdits: specs.ContainerEdits{Hooks: []*specs.Hook{theirs, old}}}
	r := Merge(other, testMounts(t), nil, true, hook)
	require.Equal(t, []specs.Hook{*hook}, r.Hooks)
	require.Equal(t, []*specs.Hook{theirs, hook}, other.ContainerEdits.Hooks)
	require.Empty(t, other.Devices[0].ContainerEdits.Hooks)
	require.Equal(t, "0.5.0", other.Version)
	Merge(other, testMounts(t), nil, true, hook)
	require.Equal(t, []*specs.Hook{theirs, hook}, other.ContainerEdits.Hooks, "merging twice gives the same spec")
	Merge(other, testMounts(t), nil, false, hook)
	require.Equal(t, []*specs.Hook{theirs}, other.ContainerEdits.Hooks, "unrendered, ours leave")
}
