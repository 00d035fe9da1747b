package prochook_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/prochook"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest/rendered"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func TestParseState(t *testing.T) {
	st, err := prochook.ParseState([]byte(`{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":42,"bundle":"/run/b/c1"}`))
	require.NoError(t, err)
	require.Equal(t, "c1", st.ID)
	require.Equal(t, "/run/b/c1", st.Bundle)
	for state, want := range map[string]string{
		``:                           "the OCI state on stdin: unexpected end of JSON input (0 bytes)",
		`{"id":"c1"`:                 "the OCI state on stdin: unexpected end of JSON input (10 bytes)",
		`{"id":"c1"}`:                `the OCI state on stdin: field bundle: value "": want the bundle's absolute path`,
		`{"id":"c1","bundle":"b/c"}`: `the OCI state on stdin: field bundle: value "b/c": want the bundle's absolute path`,
		`{"id":"c1","bundle":7}`:     "the OCI state on stdin: json: cannot unmarshal number into Go struct field State.bundle of type string (22 bytes)",
	} {
		_, err := prochook.ParseState([]byte(state))
		require.EqualError(t, err, want, "state %q", state)
	}
}

func TestRootfs(t *testing.T) {
	for config, want := range map[string]string{
		`{"root":{"path":"rootfs"}}`:                          "/b/rootfs",
		`{"root":{"path":"./rootfs/"}}`:                       "/b/rootfs",
		`{"root":{"path":"/snapshots/7/fs","readonly":true}}`: "/snapshots/7/fs",
	} {
		got, err := prochook.Rootfs("/b", []byte(config))
		require.NoError(t, err, config)
		require.Equal(t, want, got, config)
	}
	for config, want := range map[string]string{
		`{}`:                 `/b/config.json: field root.path: value "": want the container's root file system`,
		`{"root":{}}`:        `/b/config.json: field root.path: value "": want the container's root file system`,
		`{"root":"x"}`:       "/b/config.json: json: cannot unmarshal string into Go struct field .root of type specs.Root",
		`{"root":{"path":1}`: "/b/config.json: unexpected end of JSON input",
	} {
		_, err := prochook.Rootfs("/b", []byte(config))
		require.EqualError(t, err, want, config)
	}
}

func TestEntries(t *testing.T) {
	got, err := prochook.Entries(fstest.MapFS{
		"proc/modules":               {Data: []byte("nvidia 1 0 - Live 0x0\n")},
		"proc/driver/nvidia/version": {Data: []byte("NVRM version: NVIDIA UNIX\n")},
		"sys/module/nvidia/refcnt":   {Data: []byte("3\n")},
	}, "/r")
	require.NoError(t, err)
	require.Equal(t, []string{"driver", "modules"}, got, "the top-level entries of proc, nothing else")

	got, err = prochook.Entries(fstest.MapFS{"sys/module/nvidia/refcnt": {}}, "/r")
	require.NoError(t, err)
	require.Empty(t, got, "a render made before proc/ existed mounts nothing")

	_, err = prochook.Entries(fstest.MapFS{"proc/modules": {Data: []byte("/etc/shadow"), Mode: fs.ModeSymlink}}, "/r")
	require.EqualError(t, err, "/r/proc/modules: type L---------: want a file or a directory")
}

// trees holds the render the tests share: none changes it.
var trees rendered.Trees

func TestMain(m *testing.M) {
	code := overlaytest.Main(m)
	trees.Close()
	os.Exit(code)
}

// render is a complete render of a built-in profile.
func render(t *testing.T) string {
	t.Helper()
	root, _ := trees.Render(t, overlay.Options{Profile: "t4-vm"})
	return root
}

// bundle writes a bundle whose config.json names rootfs, and returns the
// state a runtime gives the hook.
func bundle(t *testing.T, rootfs string) []byte {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"root":{"path":"`+rootfs+`"}}`), 0o644))
	return []byte(`{"id":"c1","pid":1,"bundle":"` + dir + `"}`)
}

func TestRunWithoutARenderMountsNothing(t *testing.T) {
	root := t.TempDir()
	res, err := prochook.Run(root, bundle(t, "/nonexistent"), prochook.Options{})
	require.NoError(t, err)
	require.Empty(t, res.Mounted)
	require.Equal(t, []string{"container c1: nothing mounted: " + root + " holds no complete render (no completion marker: open .nvml-mock-sysfs/complete: no such file or directory)"}, res.Summary(root))
}

func TestRunBadBundle(t *testing.T) {
	root := render(t)
	_, err := prochook.Run(root, []byte(`{"id":"c1","bundle":"/nonexistent/b"}`), prochook.Options{})
	require.EqualError(t, err, "the container's bundle: open /nonexistent/b/config.json: no such file or directory")
	_, err = prochook.Run(root, []byte(`{"id":"c1","bundle":"/b"}`), prochook.Options{ReadFile: func(string) ([]byte, error) { return []byte(`{}`), nil }})
	require.EqualError(t, err, `/b/config.json: field root.path: value "": want the container's root file system`)
}

// A container whose /proc is not the runtime's procfs (an image's own
// directory, or a link out of its root) is refused before any mount: a
// mount there could land on a host path.
func TestRunRefusesAProcThatIsNotProcfs(t *testing.T) {
	root := render(t)
	rootfs := t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(rootfs, "proc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(rootfs, "proc", "modules"), nil, 0o644))
	_, err := prochook.Run(root, bundle(t, rootfs), prochook.Options{})
	require.Error(t, err)
	require.Regexp(t, `^`+rootfs+`/proc/devices \(the container's /proc/devices\): the container's /proc: file system type 0x[0-9a-f]+: want procfs \(0x9fa0\): the hook mounts only over the container's own /proc$`, err.Error())

	linked := t.TempDir()
	require.NoError(t, os.Symlink("/proc", filepath.Join(linked, "proc")))
	_, err = prochook.Run(root, bundle(t, linked), prochook.Options{})
	require.EqualError(t, err, linked+"/proc/devices (the container's /proc/devices): open the container's /proc without following links: not a directory")
}

func TestSummary(t *testing.T) {
	res := prochook.Result{Container: "c1", Mounted: []string{"/proc/devices", "/proc/driver"}, Missing: []string{"/proc/modules"}}
	require.Equal(t, []string{
		"container c1: /proc/modules skipped: this kernel has no /proc/modules to mount over",
		"container c1: mounted /proc/devices, /proc/driver from /r/proc, read-only",
	}, res.Summary("/r"))
	require.Empty(t, prochook.Result{Container: "c1"}.Summary("/r"), "an empty proc directory says nothing")
}

// procRoot is a root holding a complete render's marker and, in its proc
// directory, the given files: entries to aim at this host's own /proc.
func procRoot(t *testing.T, files ...string) string {
	t.Helper()
	marker, err := os.ReadFile(filepath.Join(render(t), writer.MarkerFile))
	require.NoError(t, err)
	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(writer.MarkerFile)), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, writer.MarkerFile), marker, 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, plan.ProcDir), 0o755))
	for _, f := range files {
		require.NoError(t, os.WriteFile(filepath.Join(root, plan.ProcDir, f), []byte("rendered\n"), 0o644))
	}
	return root
}

// The host's own root stands for a container's, its /proc for the
// container's procfs: every case here stops before mount(2), and the
// host's mounts are checked unchanged after.
func TestRunAgainstThisHostsProc(t *testing.T) {
	before := procMounts(t)
	t.Cleanup(func() { require.Equal(t, before, procMounts(t), "a mount was made on this host's /proc") })

	// A kernel lacks the entry: skipped, said, no error.
	root := procRoot(t, "nvml-mock-sysfs-absent")
	res, err := prochook.Run(root, bundle(t, "/"), prochook.Options{})
	require.NoError(t, err)
	require.Equal(t, []string{"/proc/nvml-mock-sysfs-absent"}, res.Missing)
	require.Empty(t, res.Mounted)

	// procfs's own links (/proc/self) are never followed nor mounted on.
	_, err = prochook.Run(procRoot(t, "self"), bundle(t, "/"), prochook.Options{})
	require.EqualError(t, err, "/proc/self (the container's /proc/self): the target is a symlink: refused")

	// A file where the kernel has a directory cannot be bound there.
	root = procRoot(t, "driver")
	_, err = prochook.Run(root, bundle(t, "/"), prochook.Options{})
	require.EqualError(t, err, "/proc/driver (the container's /proc/driver): the rendered "+filepath.Join(root, plan.ProcDir)+"/driver is a file, the kernel's entry a directory: a bind mount needs both files or both directories")
}

// procMounts lists this host's mounts at or below /proc (other tests'
// mounts elsewhere come and go meanwhile).
func procMounts(t *testing.T) []string {
	t.Helper()
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var mounts []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == "/proc" || strings.HasPrefix(f[4], "/proc/")) {
			mounts = append(mounts, line)
		}
	}
	return mounts
}
