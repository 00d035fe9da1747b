package containerdtest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// procHookPage is the docs page that holds TestProcHook's rows.
func procHookPage() docmatrix.Page {
	return docmatrix.Page{Path: "../../../docs/design/prochook.md", Suite: "deploy/e2e/containerdtest TestProcHook", Keys: 2}
}

// procHookMatrixEnv names a file TestProcHook also writes its rows to (the
// sabotage suite reads them there).
const procHookMatrixEnv = "NVML_MOCK_SYSFS_PROCHOOK_MATRIX"

// procHookScript is what the container prints, a section each: the
// /proc files its arguments name (relative to /proc), as "file:NAME" (procHookCommand
// names /proc/devices and /proc/driver/nvidia/version always), the
// gate's verdict, and its own mounts below /proc.
const procHookScript = `for f in "$@"; do echo "== file:$f"; cat "/proc/$f" 2>&1; done
echo '== gate'; if [ ! -e /proc/modules ]; then echo 'no /proc/modules'; elif ` + programs.OperandGateV2671 + `; then echo passes; else echo waits; fi
echo '== lsmod'; if [ ! -e /proc/modules ]; then echo 'no /proc/modules'; else lsmod 2>&1; fi
echo '== mounts'; grep ' /proc/' /proc/self/mountinfo || true
`

// TestProcHook runs real runc containers whose spec carries our
// createContainer hook (proc-hook, run from the render's own binary, as
// the CDI spec and the NRI plugin will add it), and the same containers
// without it: with the hook, the container's /proc shows the rendered
// files; without, the node's. The host's /proc and /sys/module are the
// same after as before. A sabotaged run (programs.Sabotage) gives the
// hook the sabotaged root (programs.SabotagedRoot) while the rows expect
// the render's files: with no tree the hook has nothing to mount, and the
// rows it serves turn red; escaped links change nothing it reads.
func TestProcHook(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t, "runc")
	runc, err := exec.LookPath("runc")
	if err != nil {
		overlaytest.Missing(t, "runc is not installed (apt-get install runc)")
	}
	root := filepath.Join(t.TempDir(), "overlay")
	_, _, err = overlay.Render(overlay.Options{Profile: "hgx-h100", Root: root, Binary: hosttest.BuildBinary(t), Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)
	// The hook runs from a directory of its own, as serve
	// --proc-hook-binary installs it, where it records its failures.
	hookBinary := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	require.NoError(t, os.Link(filepath.Join(root, plan.BinaryFile), hookBinary))
	servedRoot, _ := programs.SabotagedRoot(t, programs.Sabotage(t), root)
	hook := procHookArgs(hookBinary, servedRoot)
	hostBefore := hostProc(t)

	rows := &docmatrix.Rows{}
	defer func() {
		table := rows.Table("row", "container", "shows")
		t.Logf("proc-hook in %s:\n%s", runcVersion(runc), table)
		writeMatrix(t, procHookPage(), procHookMatrixEnv, table)
	}()
	files := renderedProc(t, root)
	served, code, stderr := runcRun(t, runc, hook, files...)
	require.Zero(t, code, "runc with the hook: %s", stderr)
	node, code, stderr := runcRun(t, runc, nil)
	require.Zero(t, code, "runc without the hook: %s", stderr)
	unrendered, code, stderr := runcRun(t, runc, procHookArgs(hook[0], t.TempDir()))
	require.Zero(t, code, "runc with the hook and a root without a render: %s", stderr)

	t.Run("devices", func(t *testing.T) {
		rows.Expect(t, "/proc/devices", "with the hook", "the rendered proc/devices, byte for byte")
		rendered, err := os.ReadFile(filepath.Join(root, plan.ProcDir, "devices"))
		if err != nil {
			rows.NotRun(t, programs.NotRunPrefix+"this render writes no proc/devices (its proc directory holds "+strings.Join(files, ", ")+")")
			return
		}
		require.Equal(t, string(rendered), served["file:devices"])
	})
	t.Run("version", func(t *testing.T) {
		rows.Expect(t, "/proc/driver/nvidia/version", "with the hook", "a real driver's: NVRM version: NVIDIA UNIX, the profile's 580.105.08")
		require.Regexp(t, `^NVRM version: NVIDIA UNIX x86_64 Kernel Module  580\.105\.08  `, served["file:driver/nvidia/version"])
	})
	t.Run("every rendered file", func(t *testing.T) {
		rows.Expect(t, "every file of <root>/proc", "with the hook", "the same bytes at /proc/<path>, where the kernel has its top-level entry")
		compared := 0
		for _, name := range files {
			top, _, _ := strings.Cut(name, "/")
			if _, err := os.Stat(filepath.Join("/proc", top)); err != nil {
				continue // the kernel lacks it: the gate's row
			}
			rendered, err := os.ReadFile(filepath.Join(root, plan.ProcDir, name))
			require.NoError(t, err)
			require.Equal(t, string(rendered), served["file:"+name], "/proc/%s in the container", name)
			compared++
		}
		require.NotZero(t, compared, "no rendered file compared")
	})
	for _, gate := range []struct{ name, container, want, out string }{
		{"gate", "with the hook", "passes", served["gate"]},
		{"gate: control", "without the hook (control)", "waits", node["gate"]},
	} {
		t.Run(gate.name, func(t *testing.T) {
			requireGate(t, rows, gate.container, gate.want, gate.out)
		})
	}
	t.Run("lsmod", func(t *testing.T) {
		rows.Expect(t, "`lsmod` (kmod's, from the node's /usr)", "with the hook", "nvidia and its stack beside the node's own modules")
		if served["lsmod"] == "no /proc/modules" {
			rows.NotRun(t, programs.NotRunPrefix+"this kernel has no /proc/modules (built without modules): lsmod has nothing to list, and the hook nothing to mount over")
			return
		}
		require.Regexp(t, `(?m)^nvidia\s+\d+\s+\d+\s+\S*nvidia_uvm`, served["lsmod"])
		node := strings.Count(node["lsmod"], "\n")
		require.Greater(t, strings.Count(served["lsmod"], "\n"), node, "ours beside the node's own")
	})
	t.Run("mounts", func(t *testing.T) {
		rows.Expect(t, "the container's mounts below /proc", "with the hook", "a read-only (ro,nosuid,nodev,noexec) bind of each rendered entry the kernel has")
		for _, e := range []string{"/proc/driver", "/proc/devices"} {
			if _, err := os.Stat(filepath.Join(root, plan.ProcDir, filepath.Base(e))); err != nil {
				continue
			}
			require.Regexp(t, `(?m)^\S+ \S+ \S+ \S+ `+e+` ro,nosuid,nodev,noexec[, ]`, served["mounts"], "mountinfo of the container")
		}
	})
	t.Run("control: node", func(t *testing.T) {
		requireNodeProc(t, rows, "without the hook (control)", node)
	})
	t.Run("control: unrendered", func(t *testing.T) {
		rows.Expect(t, "/proc/driver/nvidia/version", "with the hook, its root without a render", "starts, with the node's files: the hook mounts nothing")
		require.NotContains(t, unrendered["file:driver/nvidia/version"], "NVRM")
		require.NotContains(t, unrendered["mounts"], " /proc/driver ")
	})
	t.Run("fails open", func(t *testing.T) {
		rows.Expect(t, "a rendered entry the kernel's differs from in type", "with the hook", "starts, with the node's /proc/driver: the hook fails open, its one line in its failures file")
		// The render's completion marker, and a file where the kernel has
		// the directory /proc/driver.
		broken := t.TempDir()
		marker, err := os.ReadFile(filepath.Join(root, writer.MarkerFile))
		require.NoError(t, err)
		for name, data := range map[string][]byte{writer.MarkerFile: marker, plan.ProcDir + "/driver": []byte("a file\n")} {
			require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(broken, name)), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(broken, name), data, 0o644))
		}
		failed, code, stderr := runcRun(t, runc, procHookArgs(hookBinary, broken))
		require.Zero(t, code, "runc refused a container whose hook could not serve it: %s", stderr)
		require.NotContains(t, failed["file:driver/nvidia/version"], "NVRM")
		recorded, err := os.ReadFile(cdispec.ProcHookFailures(hookBinary))
		require.NoError(t, err, "the hook's failures file")
		require.Contains(t, string(recorded), "proc-hook: container ")
		require.Contains(t, string(recorded), "(the container's /proc/driver): the rendered "+filepath.Join(broken, plan.ProcDir)+"/driver is a file, the kernel's entry a directory")
		require.Equal(t, 1, strings.Count(string(recorded), "\n"), "one line")
	})
	t.Run("shared /proc", func(t *testing.T) {
		rows.Expect(t, "a /proc mounted with shared propagation (Bidirectional)", "with the hook", "starts, with the node's /proc: the hook refuses, since its bind would reach the /proc's peers, its one line in its failures file")
		before, err := os.ReadFile(cdispec.ProcHookFailures(hookBinary))
		require.NoError(t, err, "the failures row before this one wrote the file")
		// The render itself, not the sabotaged root: the row is the
		// hook's refusal, which a root without a render would never reach.
		shared, code, stderr := runcRunSpec(t, runc, procHookArgs(hookBinary, root), func(s *specs.Spec) {
			for i, m := range s.Mounts {
				if m.Destination == "/proc" {
					s.Mounts[i].Options = append(s.Mounts[i].Options, "rshared")
				}
			}
		})
		require.Zero(t, code, "runc refused a container whose hook could not serve it: %s", stderr)
		require.NotContains(t, shared["file:driver/nvidia/version"], "NVRM")
		require.NotContains(t, shared["mounts"], " /proc/driver ")
		after, err := os.ReadFile(cdispec.ProcHookFailures(hookBinary))
		require.NoError(t, err)
		require.Contains(t, strings.TrimPrefix(string(after), string(before)), "the container's /proc is a shared mount")
	})
	t.Run("host", func(t *testing.T) {
		rows.Expect(t, "the host's /proc and /sys/module", "after every run", "unchanged: no mount below them, the same /proc/devices and /proc/driver")
		require.Equal(t, hostBefore, hostProc(t))
	})
}

// requireGate is the row of the GPU Operator's gate in a container: out,
// procHookScript's gate section, is want, or the row is not run where the
// kernel has no /proc/modules.
func requireGate(t *testing.T, rows *docmatrix.Rows, container, want, out string) {
	t.Helper()
	rows.Expect(t, "GPU Operator v26.7.1 gate, "+"`"+programs.OperandGateV2671+"`", container, want)
	if out == "no /proc/modules" {
		rows.NotRun(t, programs.NotRunPrefix+"this kernel has no /proc/modules (built without modules): nothing to grep, and nothing for the hook to mount over (it skips it)")
		return
	}
	require.Equal(t, want, out)
}

// requireNodeProc is the control's row: container, whose procHookScript
// sections are node, sees the node's /proc: its /proc/devices, no NVRM,
// no mount below /proc.
func requireNodeProc(t *testing.T, rows *docmatrix.Rows, container string, node map[string]string) {
	t.Helper()
	rows.Expect(t, "/proc/devices, /proc/driver/nvidia/version, mounts", container, "the node's: its /proc/devices, no NVRM, no mount below /proc")
	hostDevices, err := os.ReadFile("/proc/devices")
	require.NoError(t, err)
	require.Equal(t, string(hostDevices), node["file:devices"])
	require.NotContains(t, node["file:driver/nvidia/version"], "NVRM")
	require.NotContains(t, node["mounts"], " /proc/driver ")
	require.NotContains(t, node["mounts"], " /proc/devices ")
}

// runcRun runs procHookScript in a runc container of a root holding the
// host's /usr alone, in a private mount namespace with a private /run (as
// containerd runs runc: its state stays off the host), with hook as its
// createContainer hook unless nil; files are the script's arguments. It returns the script's sections by
// name, runc's exit code and its standard error.
func runcRun(t *testing.T, runc string, hook []string, files ...string) (map[string]string, int, string) {
	t.Helper()
	return runcRunSpec(t, runc, hook, nil, files...)
}

// runcRunSpec is runcRun with the spec changed by edit, unless nil.
func runcRunSpec(t *testing.T, runc string, hook []string, edit func(*specs.Spec), files ...string) (map[string]string, int, string) {
	t.Helper()
	bundle := t.TempDir()
	rootfs := filepath.Join(bundle, "rootfs")
	for _, dir := range []string{"proc", "dev", "sys", "usr", "tmp"} {
		require.NoError(t, os.MkdirAll(filepath.Join(rootfs, dir), 0o755))
	}
	for _, dir := range []string{"bin", "lib", "lib64", "sbin"} {
		require.NoError(t, os.Symlink("usr/"+dir, filepath.Join(rootfs, dir)))
	}
	// runc's own default spec, so the container is what runc makes of it.
	out, err := exec.Command(runc, "spec", "--bundle", bundle).CombinedOutput()
	require.NoError(t, err, "runc spec: %s", out)
	file := filepath.Join(bundle, "config.json")
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	var spec specs.Spec
	require.NoError(t, json.Unmarshal(b, &spec))
	spec.Process.Terminal = false
	spec.Process.Args = procHookCommand(files)
	spec.Mounts = append(spec.Mounts, specs.Mount{Destination: "/usr", Type: "bind", Source: "/usr", Options: []string{"rbind", "ro"}})
	cgroup := fmt.Sprintf("/nvml-mock-sysfs-prochook-%d", time.Now().UnixNano())
	spec.Linux.CgroupsPath = cgroup
	t.Cleanup(func() {
		if err := containerdtest.RemoveCgroup(cgroup); err != nil {
			t.Error(err)
		}
	})
	if hook != nil {
		spec.Hooks = &specs.Hooks{CreateContainer: []specs.Hook{{Path: hook[0], Args: hook}}}
	}
	if edit != nil {
		edit(&spec)
	}
	b, err = json.Marshal(spec)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(file, b, 0o644))
	id := filepath.Base(bundle)
	cmd := hosttest.Served{Tmpfs: []string{"/run"}}.Command(runc, "--root", filepath.Join(bundle, "state"), "run", "--bundle", bundle, id)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	if code < 0 {
		t.Fatalf("runc run: %v", err)
	}
	return sections(stdout.String()), code, stderr.String()
}

// procHookCommand runs procHookScript with files, and the two it names
// always, each once.
func procHookCommand(files []string) []string {
	files = append([]string{"devices", "driver/nvidia/version"}, files...)
	slices.Sort(files)
	return append([]string{"sh", "-c", procHookScript, "sh"}, slices.Compact(files)...)
}

// sections splits procHookScript's output at its "== name" lines.
func sections(out string) map[string]string {
	got := map[string]string{}
	name := ""
	for _, line := range strings.SplitAfter(out, "\n") {
		if n, ok := strings.CutPrefix(line, "== "); ok {
			name = strings.TrimSpace(n)
			continue
		}
		got[name] += line
	}
	for name, text := range got {
		if name == "gate" || name == "lsmod" {
			got[name] = strings.TrimSpace(text)
		}
	}
	return got
}

// renderedProc lists the files of the render's proc directory.
func renderedProc(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	require.NoError(t, fs.WalkDir(os.DirFS(filepath.Join(root, plan.ProcDir)), ".", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, p)
		}
		return err
	}))
	return files
}

// hostProc is what the hook must leave alone on the host: the mounts at
// or below /proc and /sys/module, /proc/devices and /proc/driver's
// entries.
func hostProc(t *testing.T) string {
	t.Helper()
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var lines []string
	for _, line := range strings.Split(string(mountinfo), "\n") {
		if f := strings.Fields(line); len(f) > 4 && (f[4] == "/proc" || strings.HasPrefix(f[4], "/proc/") || strings.HasPrefix(f[4], "/sys/module")) {
			lines = append(lines, "mount "+f[4]+" "+f[5])
		}
	}
	devices, err := os.ReadFile("/proc/devices")
	require.NoError(t, err)
	driver, err := os.ReadDir("/proc/driver")
	require.NoError(t, err)
	var names []string
	for _, d := range driver {
		names = append(names, d.Name())
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n/proc/driver: " + strings.Join(names, " ") + "\n/proc/devices:\n" + string(devices)
}

// runcVersion is runc's first version line.
func runcVersion(runc string) string {
	out, _ := exec.Command(runc, "--version").Output()
	first, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(first)
}

// procHookArgs is the hook's argv as the edits carry it (cdispec.ProcHook).
func procHookArgs(binary, root string) []string {
	return cdispec.ProcHook(binary, root).Args
}
