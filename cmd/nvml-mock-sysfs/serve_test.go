package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// serve's usage errors look like every other command's: exit 2 and one
// line naming serve and where to read its usage.
func TestServeUsageErrors(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--root", root}, "give --output FILE, --merge-into FILE, or both"},
		{[]string{"serve", "--root", root, "--merge-into", "/x.yaml", "--kind", "a.com/b"}, "--kind applies to --output"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--kind", "nokind"}, "--kind: "},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--log-format", "xml"}, `--log-format "xml": want text or json`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--log-level", "loud"}, "--log-level"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--also-at", "/host/sys/bus/pci/devices"}, "/host/sys/bus/pci/devices"},
		{[]string{"serve", "--root", "relative", "--output", "/x.yaml"}, `--root: root "relative" must be an absolute path`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--hierarchy", "mesh"}, `--hierarchy "mesh"`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--no-such-flag"}, "flag provided but not defined: --no-such-flag"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "extra-arg"}, "unexpected arguments: extra-arg"},
		// A typo of a built-in name no resync can mend.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--profile", "h200"}, `profile "h200": not a built-in (dgx-a100, hgx-h100, gb200-tray, t4-vm)`},
		// The fleet map chooses the profile, by the node's name.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--fleet", "/f.yaml", "--node-name", "n", "--profile", "t4-vm"}, "--fleet and --profile: give one"},
		// Explicit, even when it equals the default.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--fleet", "/f.yaml", "--node-name", "n", "--profile", "dgx-a100"}, "--fleet and --profile: give one"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--fleet", "/f.yaml"}, "--fleet needs --node-name NAME"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--fleet", "/f.yaml", "--node-name", ""}, "--fleet needs --node-name NAME"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--fleet", "", "--node-name", "n"}, "--fleet: empty"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--node-name", "n"}, "--node-name applies to --fleet"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--kubeconfig", "/k"}, "--kubeconfig applies to --fleet"},
		// The NRI plugin's flags: one line naming the flag and the value.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri-socket", "/s"}, "--nri-socket applies to --nri"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-inject", "all"}, `--nri-inject "all": want node, selected or annotated`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-inject", "selected"}, "--nri-inject selected: give --nri-namespaces, --nri-pod-selector, or both"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-inject", "selected", "--nri-pod-selector", "app in (gfd"}, `--nri-pod-selector "app in (gfd": `},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-namespaces", "gpu"}, "--nri-namespaces and --nri-pod-selector apply to --nri-inject selected"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-inject", "annotated", "--nri-exclude-namespaces", ""}, "--nri-exclude-namespaces applies to --nri-inject node"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-own-pods", "=x"}, `--nri-own-pods "=x": `},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-index", "100"}, `nri plugin index "100": want two digits`},
		// An empty own-pods selector matches every pod: serve would serve
		// none, and say nothing.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-own-pods", ""}, `--nri-own-pods "": own pods selector "": matches every pod, so none would be served`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-own-pods", " "}, `--nri-own-pods " ": own pods selector "": matches every pod`},
		// The writers: with --writable and --nri, none that names every pod.
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--nri", "--nri-writable-pods", "app=x"}, "--nri-writable-pods applies to --writable"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--writable", "--nri-writable-pods", "app=x"}, "--nri-writable-pods applies to --nri"},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--writable", "--nri", "--nri-writable-pods", "dra:app=x", "--nri-writable-pods", ""}, `--nri-writable-pods: writer "": names no namespace and no labels, so every pod`},
		{[]string{"serve", "--root", root, "--output", "/x.yaml", "--writable", "--nri", "--nri-writable-pods", "dra:app in (x"}, `--nri-writable-pods: writer "dra:app in (x": `},
	}
	for _, tc := range tests {
		stderr := requireOneLineUsageError(t, "serve", tc.args...)
		require.Contains(t, stderr, tc.want, "%v", tc.args)
	}
	code, stdout, stderr := runCLI(t, "serve", "-h")
	require.Equal(t, exitOK, code)
	require.Empty(t, stderr)
	require.Contains(t, stdout, "\n  --listen string\n")
	require.Contains(t, stdout, "\n  --strict\n")
	require.Contains(t, stdout, "never re-uses the root's own effective profile")
	require.Contains(t, stdout, "\n  --fleet string\n")
	require.Contains(t, stdout, "\n  --node-name string\n")
	require.Contains(t, stdout, "\n  --kubeconfig string\n")
	require.Contains(t, stdout, "get, list and watch on nodes")
	require.Contains(t, stdout, "\n  --nri\n")
	require.Contains(t, stdout, "nvml-mock.nvidia.com/inject")
	require.Contains(t, stdout, "\n  --nri-writable-pods value\n")
	require.Contains(t, stdout, "nvml-mock-sysfs.nvidia.com/writable")
}
