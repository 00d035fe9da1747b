package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// runHook runs proc-hook as a runtime does: the state on standard input.
func runHook(t *testing.T, state string, args ...string) (int, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	e := &env{stdout: &stdout, stderr: &stderr, stdin: strings.NewReader(state)}
	code := run(e, append([]string{"proc-hook"}, args...))
	require.Empty(t, stdout.String(), "a hook's standard output is the runtime's")
	return code, stderr.String()
}

func TestProcHookWithoutARenderMountsNothing(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	code, stderr := runHook(t, `{"id":"c1","bundle":"/run/b/c1"}`, "--root", root)
	require.Equal(t, exitOK, code, stderr)
	require.Equal(t, "nvml-mock-sysfs proc-hook: container c1: nothing mounted: "+root+
		" holds no complete render (no completion marker: open .nvml-mock-sysfs/complete: no such file or directory)\n", stderr)
}

// The hook fails open: a bad state costs the container the /proc files,
// never its start, and the one line goes to stderr and to --failures.
func TestProcHookFailsOpenInOneLine(t *testing.T) {
	t.Parallel()
	failures := filepath.Join(t.TempDir(), "proc-hook-failures")
	want := "nvml-mock-sysfs: proc-hook: the OCI state on stdin: field bundle: value \"\": want the bundle's absolute path; the container starts with the node's /proc\n"
	for range 2 {
		code, stderr := runHook(t, `{"id":"c1"}`, "--root", t.TempDir(), "--failures", failures)
		require.Equal(t, exitOK, code)
		require.Equal(t, want, stderr)
	}
	recorded, err := os.ReadFile(failures)
	require.NoError(t, err)
	require.Equal(t, strings.Repeat(strings.TrimPrefix(want, "nvml-mock-sysfs: "), 2), string(recorded), "a line per failure")

	code, stderr := runHook(t, `{"id":"c1"}`, "--root", t.TempDir(), "--failures", filepath.Join(t.TempDir(), "no", "such", "dir"))
	require.Equal(t, exitOK, code, "an unwritable --failures fails open too")
	require.Contains(t, stderr, "proc-hook: --failures ")

	code, stderr = runHook(t, `{}`, "--root", t.TempDir(), "extra")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, "unexpected arguments: extra")
	code, stderr = runHook(t, `{}`, "--root", "overlay")
	require.Equal(t, exitUsage, code)
	require.Equal(t, "nvml-mock-sysfs proc-hook: --root: root \"overlay\" must be an absolute path; run 'nvml-mock-sysfs proc-hook -h' for usage\n", stderr)
	code, stderr = runHook(t, `{}`, "--root", t.TempDir(), "--failures", "failures")
	require.Equal(t, exitUsage, code)
	require.Contains(t, stderr, `--failures: "failures" is not an absolute path`)
}
