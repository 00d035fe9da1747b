package main

import (
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// requireOneLineUsageError checks what every usage error looks like: exit
// 2 and one line on stderr, naming the command and where to read its usage.
func requireOneLineUsageError(t *testing.T, cmd string, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCLI(t, args...)
	require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
	require.Empty(t, stdout, "%v", args)
	require.Equal(t, 1, strings.Count(stderr, "\n"), "%v: one line, never the usage: %s", args, stderr)
	require.True(t, strings.HasPrefix(stderr, "nvml-mock-sysfs "+cmd+": "), "%v: %s", args, stderr)
	require.True(t, strings.HasSuffix(stderr, "; run 'nvml-mock-sysfs "+cmd+" -h' for usage\n"), "%v: %s", args, stderr)
	return stderr
}

func TestUsageErrorsAreOneLine(t *testing.T) {
	t.Parallel()
	tests := []struct {
		cmd  string
		args []string
		want string
	}{
		{"render", []string{"render", "--no-such-flag"}, "flag provided but not defined: --no-such-flag"},
		{"render", []string{"render", "extra-arg"}, "unexpected arguments: extra-arg"},
		{"render", []string{"render", "--profile", "h200", "--root", "/nonexistent/x"}, `profile "h200": not a built-in (dgx-a100, hgx-h100, gb200-tray, t4-vm)`},
		{"render", []string{"render", "--profile", "h200", "--dry-run"}, `profile "h200": not a built-in`},
		{"compat", []string{"compat", "--profile", "h200", "--sysfs", "/sys"}, `profile "h200": not a built-in`},
		{"fidelity", []string{"fidelity", "--profile", "h200", "--sysfs", "/sys"}, `profile "h200": not a built-in`},
		{"fidelity", []string{"fidelity", "--profile", "h200", "--sysfs", "/sys", "--device", "0000:07:00.0"}, `profile "h200": not a built-in`},
		{"verify", []string{"verify", "--profile", "h200"}, `profile "h200": not a built-in`},
		{"compat", []string{"compat", "--root", "relative"}, `--root: root "relative" must be an absolute path`},
		{"fidelity", []string{"fidelity", "--root", "relative"}, `--root: root "relative" must be an absolute path`},
		{"profiles", []string{"profiles", "--show"}, "flag needs an argument: --show"},
		{"profiles", []string{"profiles", "--show", "b300"}, `--show "b300": not a built-in profile (dgx-a100, hgx-h100, gb200-tray, t4-vm)`},
		{"import", []string{"import", "foo", "bar.xml"}, `"foo" is not a capture format: want nvidia-smi`},
		{"import", []string{"import"}, "want the capture's format, nvidia-smi, and a file"},
		{"mounts", []string{"mounts", "--lock"}, "flag provided but not defined: --lock"},
		{"cdi", []string{"cdi", "--root", "/x"}, "give --output FILE or --merge-into FILE"},
		{"help", []string{"help", "render", "compat"}, `want one command, got "render compat"`},
		{"serve", []string{"serve", "--fleet-configmap", "ns/fleet", "--output", "/x/spec.yaml"}, "--fleet-configmap needs --fleet DIR/fleet.yaml"},
		{"serve", []string{"serve", "--fleet", "/x/map.yaml", "--node-name", "n", "--fleet-configmap", "ns/fleet", "--output", "/x/spec.yaml"}, `--fleet "/x/map.yaml": with --fleet-configmap, name DIR/fleet.yaml`},
		{"serve", []string{"serve", "--fleet", "/x/fleet.yaml", "--node-name", "n", "--fleet-configmap", "fleet", "--output", "/x/spec.yaml"}, `--fleet-configmap "fleet": want NAMESPACE/NAME`},
		{"publish", []string{"publish", "--fleet-configmap", "ns/fleet"}, "give --node-selector SELECTOR"},
		{"publish", []string{"publish", "--node-selector", "type in (kwok", "--fleet-configmap", "ns/fleet"}, `--node-selector "type in (kwok": `},
		{"publish", []string{"publish", "--node-selector", "type=kwok", "--fleet-configmap", "fleet"}, `--fleet-configmap "fleet": want NAMESPACE/NAME`},
		{"publish", []string{"publish", "--node-selector", "type=kwok", "--fleet-configmap", "ns/Fleet"}, `--fleet-configmap "ns/Fleet": name "Fleet": a lowercase RFC 1123 subdomain`},
		{"publish", []string{"publish", "--node-selector", "type=kwok", "--fleet-configmap", "ns/fleet", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{"slices", []string{"slices", "--node-name", "n"}, "give --profile NAME|FILE or --fleet FILE"},
		{"slices", []string{"slices", "--profile", "t4-vm"}, "give --node-name NAME"},
		{"slices", []string{"slices", "--profile", "t4-vm", "--fleet", "f.yaml", "--node-name", "n"}, "--fleet and --profile: give one"},
		{"slices", []string{"slices", "--profile", "t4-vm", "--node-name", "n", "--format", "table"}, `--format "table": want yaml or json`},
		{"slices", []string{"slices", "--profile", "t4-vm", "--node-name", "n", "--node-labels", "a=b"}, "--node-labels applies to --fleet"},
		{"slices", []string{"slices", "--profile", "h200", "--node-name", "n"}, `profile "h200": not a built-in`},
	}
	for _, tc := range tests {
		stderr := requireOneLineUsageError(t, tc.cmd, tc.args...)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, _, stderr := runCLI(t, "frobnicate")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "nvml-mock-sysfs: unknown command \"frobnicate\"; run 'nvml-mock-sysfs -h' for the commands\n", stderr)
}

// help CMD is CMD -h: the usage line, every flag spelled --flag as the
// usage line and docs/reference/commands.md spell them, and the command's notes.
func TestHelpCommand(t *testing.T) {
	t.Parallel()
	for _, c := range commands() {
		t.Run(c.name, func(t *testing.T) {
			code, help, stderr := runCLI(t, "help", c.name)
			require.Equal(t, exitOK, code, stderr)
			require.Empty(t, stderr)
			require.True(t, strings.HasPrefix(help, "Usage: nvml-mock-sysfs "+c.name+" "), help)
			code, dashH, _ := runCLI(t, c.name, "-h")
			require.Equal(t, exitOK, code)
			require.Equal(t, dashH, help)
			require.NotRegexp(t, `(?m)^\s+-[a-z]`, help, "flags print as --flag")
			require.Regexp(t, `(?m)^  --[a-z]`, help)
		})
	}
	code, out, _ := runCLI(t, "help", "render")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "Without --profile, render re-uses the effective profile")
	code, out, _ = runCLI(t, "help")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "Commands:")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	code, out, stderr := runCLI(t, "--version")
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `^nvml-mock-sysfs \S* \S+, revision .+, go1\.\d+`, out)

	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/nvml-mock/nvml-mock-sysfs", Version: "v0.3.0"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "6e82967abc"}, {Key: "vcs.modified", Value: "true"}}}
	require.Equal(t, "nvml-mock-sysfs github.com/nvml-mock/nvml-mock-sysfs v0.3.0, revision 6e82967abc (modified), go1.26.8", versionLine(bi))
	bi.Settings = nil
	require.Contains(t, versionLine(bi), "revision unknown (built without VCS stamping")
}

// Item 1 of issue 12: a render for one container root served at another
// silently broke 41 of 63 checks in the container. cdi and mounts now take
// the container root from the render, refuse a conflicting flag, and compat
// on the host checks that the links resolve where the render says.
func TestContainerRootComesFromTheRender(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t, "--container-root", "/opt/other")
	out := filepath.Join(t.TempDir(), "spec.yaml")
	code, stdout, stderr := runCLI(t, "cdi", "--root", root, "--output", out)
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "  "+root+" -> /opt/other\n")
	s, err := cdi.ReadSpec(out, 0)
	require.NoError(t, err)
	require.Equal(t, "/opt/other", s.Devices[0].ContainerEdits.Mounts[0].ContainerPath)

	code, stdout, stderr = runCLI(t, "mounts", "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, "(?m)^"+regexp.QuoteMeta(root)+`\s+/opt/other\s`, stdout)

	for _, cmd := range []string{"cdi", "mounts"} {
		args := []string{cmd, "--root", root, "--container-root", "/opt/nvml-mock"}
		if cmd == "cdi" {
			args = append(args, "--output", filepath.Join(t.TempDir(), "other.yaml"))
		}
		stderr := requireOneLineUsageError(t, cmd, args...)
		require.Contains(t, stderr, "--container-root /opt/nvml-mock: the render at "+root+" was made for /opt/other, and its links point there; drop the flag, or render again with --container-root /opt/nvml-mock")
	}

	code, stdout, stderr = runCLI(t, "compat", "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Regexp(t, `links at the container root\s+\*\s+ok\s+with the overlay at /opt/other, all \d+ entries resolve into /opt/other/sys/devices/`, stdout)
	requireOneLineUsageError(t, "compat", "compat", "--root", root, "--container-root", "/opt/nvml-mock")

	// A tree whose links point elsewhere than its marker says: compat on
	// the host fails, as the container would.
	marker := filepath.Join(root, writer.MarkerFile)
	b, err := os.ReadFile(marker)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(marker, []byte(strings.Replace(string(b), "container-root /opt/other", "container-root /opt/nvml-mock", 1)), 0o644))
	code, stdout, _ = runCLI(t, "compat", "--root", root)
	require.Equal(t, exitFailure, code)
	require.Regexp(t, `links at the container root\s+\*\s+FAIL\s+with the overlay at /opt/nvml-mock, \d+ of \d+ entries do not resolve into it: 0000:\S+ resolves to /opt/other/sys/devices/`, stdout)
}

func TestVerifyOutsideAContainer(t *testing.T) {
	t.Parallel()
	// On the disk: a container root may not lie under /dev, where
	// overlaytest.Main may put t.TempDir.
	ctr := overlaytest.DiskTempDir(t)
	code, _, stderr := runCLI(t, "verify", "--container-root", ctr)
	require.Equal(t, exitFailure, code)
	require.Equal(t, "nvml-mock-sysfs: verify: no effective profile at "+ctr+"/effective-profile.json: verify checks the container it runs in, "+
		"which must have been given the mock.nvidia.com/pcisysfs=all device (the overlay mounted at "+ctr+"); "+
		"to check a render on the host, run 'nvml-mock-sysfs compat --root DIR'\n", stderr)
}

// Item 7: a re-render without --profile keeps the root's profile rather
// than silently replacing it with the default.
func TestRerenderWithoutProfileKeepsTheRootsProfile(t *testing.T) {
	t.Parallel()
	root := renderedRoot(t) // t4-vm: 4 GPUs
	code, out, stderr := runCLI(t, "render", "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, "nvml-mock-sysfs: render: no --profile: re-using the effective profile of the render in "+root+"\n", stderr)
	require.Contains(t, out, "GPUs 4, NVSwitches 0")
	require.Contains(t, out, "wrote 0 files, 0 links", "the same tree: nothing to write")

	code, out, _ = runCLI(t, "render", "--root", root, "--profile", "hgx-h100")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "GPUs 8, NVSwitches 4")
	code, out, _ = runCLI(t, "render", "--root", root, "--dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, out, "GPUs 8, NVSwitches 4", "now hgx-h100 is kept")

	fresh := filepath.Join(t.TempDir(), "overlay")
	code, out, stderr = runCLI(t, "render", "--root", fresh, "--dry-run")
	require.Equal(t, exitOK, code)
	require.Empty(t, stderr)
	require.Contains(t, out, "planned built-in dgx-a100", "a root without a render gets the default")
}

// Item 8: a directory that holds no render but has files where the overlay
// goes is the user's: refused, naming them, unless --force.
func TestRenderRefusesANeverRenderedRootWithFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mine := map[string]string{plan.ProfileFile: "{\"mine\": 1}\n", plan.BinaryFile: "#!/bin/sh\necho mine\n"}
	for name, content := range mine {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, name), []byte(content), 0o644))
	}
	code, _, stderr := runCLI(t, "render", "--root", root, "--profile", "t4-vm")
	require.Equal(t, exitFailure, code)
	require.Equal(t, 1, strings.Count(stderr, "\n"), stderr)
	require.Contains(t, stderr, root+" holds no render (no .nvml-mock-sysfs/manifest) but already has "+plan.ProfileFile+", "+plan.BinaryFile+" where a render writes: refusing to replace them; --force replaces them")
	for name, content := range mine {
		b, err := os.ReadFile(filepath.Join(root, name))
		require.NoError(t, err)
		require.Equal(t, content, string(b), "left as it was")
	}
	code, _, stderr = runCLI(t, "render", "--root", root, "--profile", "t4-vm", "--force")
	require.Equal(t, exitOK, code, stderr)
}

// Item 2: a typo is a warning naming the file, the field and the nearest
// known key; --strict refuses it before anything is written.
func TestRenderWarnsOfUnknownKeys(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	prof := filepath.Join(dir, "typo.yaml")
	require.NoError(t, os.WriteFile(prof, []byte("devices:\n  - index: 0\n    pci:\n      bus_id: \"0000:07:00.0\"\n      subsytem_id: 0x134F10DE\n      device_id: 0x20B010DE\n"), 0o644))
	root := filepath.Join(dir, "root")
	code, _, stderr := runCLI(t, "render", "--root", root, "--profile", prof)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, "nvml-mock-sysfs: render: warning: profile "+prof+": devices[0].pci.subsytem_id: unknown key (line 5), not in nvml-mock's profile schema; nearest known key: subsystem_id\n", stderr)

	strictRoot := filepath.Join(dir, "strict")
	code, _, stderr = runCLI(t, "render", "--root", strictRoot, "--profile", prof, "--strict")
	require.Equal(t, exitFailure, code)
	require.Equal(t, "nvml-mock-sysfs: profile "+prof+": devices[0].pci.subsytem_id: unknown key (line 5), not in nvml-mock's profile schema; nearest known key: subsystem_id; --strict refuses keys nvml-mock does not know\n", stderr)
	_, err := os.Stat(strictRoot)
	require.ErrorIs(t, err, os.ErrNotExist, "nothing written")

	// A top-level typo that leaves no devices: the warning names the key
	// before the error that follows from it.
	require.NoError(t, os.WriteFile(prof, []byte("device_default:\n  pci: {device_id: 0x20B010DE}\n"), 0o644))
	_, _, stderr = runCLI(t, "render", "--root", root, "--profile", prof, "--dry-run")
	require.True(t, strings.HasPrefix(stderr, "nvml-mock-sysfs: render: warning: profile "+prof+": device_default: unknown key (line 1), not in nvml-mock's profile schema; nearest known key: device_defaults\n"), stderr)
}
