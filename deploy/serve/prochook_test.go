package serve

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
)

// TestInstallExecutable: the binary lands whole and executable, through a
// rename in its own directory (a hook running the old one keeps it), and
// the same bytes again write nothing.
func TestInstallExecutable(t *testing.T) {
	src := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	require.NoError(t, os.WriteFile(src, []byte("binary v1"), 0o600))
	dst := filepath.Join(t.TempDir(), "hook", "nvml-mock-sysfs")
	require.NoError(t, installExecutable(src, dst))
	got, err := os.ReadFile(dst)
	require.NoError(t, err)
	require.Equal(t, "binary v1", string(got))
	st, err := os.Stat(dst)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), st.Mode().Perm())

	// Unchanged: not rewritten (the same inode, and a mode changed since
	// stays as it is), unless root may not run it.
	require.NoError(t, os.Chmod(dst, 0o700))
	require.NoError(t, installExecutable(src, dst))
	again, err := os.Stat(dst)
	require.NoError(t, err)
	require.True(t, os.SameFile(st, again), "the same bytes write nothing")
	require.Equal(t, os.FileMode(0o700), again.Mode().Perm())
	require.NoError(t, os.Chmod(dst, 0o644))
	require.NoError(t, installExecutable(src, dst))
	fixed, err := os.Stat(dst)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o755), fixed.Mode().Perm(), "the same bytes, not executable: made again")
	st = fixed

	// Changed: replaced by a rename, never written in place, and no
	// pending file left beside it.
	running, err := os.Open(dst)
	require.NoError(t, err)
	defer running.Close()
	require.NoError(t, os.WriteFile(src, []byte("binary v2"), 0o600))
	require.NoError(t, installExecutable(src, dst))
	got, err = os.ReadFile(dst)
	require.NoError(t, err)
	require.Equal(t, "binary v2", string(got))
	replaced, err := os.Stat(dst)
	require.NoError(t, err)
	require.False(t, os.SameFile(st, replaced), "a new file took the old one's name")
	require.Equal(t, os.FileMode(0o755), replaced.Mode().Perm())
	old := make([]byte, 9)
	_, err = running.ReadAt(old, 0)
	require.NoError(t, err)
	require.Equal(t, "binary v1", string(old), "the old file, open, is untouched")
	left, err := os.ReadDir(filepath.Dir(dst))
	require.NoError(t, err)
	require.Len(t, left, 1)
}

// TestProcHookBinaryBadPath: a path that is not absolute is refused by
// New; one that cannot be written is Run's error; each one line naming
// the flag and the value.
func TestProcHookBinaryBadPath(t *testing.T) {
	_, err := New(Options{Output: filepath.Join(t.TempDir(), "spec.yaml"), ProcHookBinary: "hook/nvml-mock-sysfs"})
	require.EqualError(t, err, `--proc-hook-binary "hook/nvml-mock-sysfs": must be an absolute path`)

	blocker := filepath.Join(t.TempDir(), "a-file")
	require.NoError(t, os.WriteFile(blocker, nil, 0o644))
	bad := filepath.Join(blocker, "nvml-mock-sysfs")
	s, err := New(Options{Output: filepath.Join(t.TempDir(), "spec.yaml"), ProcHookBinary: bad, Listen: "127.0.0.1:0"})
	require.NoError(t, err)
	err = s.Run(context.Background())
	require.EqualError(t, err, `--proc-hook-binary "`+bad+`": mkdir `+blocker+`: not a directory`)
}

// TestProcHookInTheEdits: with ProcHookBinary, serve installs its own
// executable there before its first sync, and every channel's edits (the
// spec's device, the NRI plugin's) carry the hook that runs it on the
// overlay root.
func TestProcHookInTheEdits(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "hook", "nvml-mock-sysfs")
	var o Options
	s := start(t, newConfigMap(t, builtinText(t, "dgx-a100")), func(opts *Options) {
		opts.ProcHookBinary = bin
		opts.NRI = &nriplugin.Options{Socket: filepath.Join(t.TempDir(), "no-runtime.sock")}
		o = *opts
	})
	s.waitFirstSync()
	self, err := os.Executable()
	require.NoError(t, err)
	want, err := os.ReadFile(self)
	require.NoError(t, err)
	got, err := os.ReadFile(bin)
	require.NoError(t, err)
	require.Equal(t, want, got, "serve's own executable")

	hook := []*specs.Hook{cdispec.ProcHook(bin, o.Render.Root)}
	edits, err := s.srv.Edits()
	require.NoError(t, err)
	require.Equal(t, hook, edits.Hooks)
	spec, err := cdispec.ReadSpec(o.Output)
	require.NoError(t, err)
	require.Equal(t, hook, spec.Devices[0].ContainerEdits.Hooks)
	require.Equal(t, "0.3.0", spec.Version)

	// What the hook could not serve, it appends beside its binary; serve
	// counts the lines.
	_, body := s.probe(endpoints.MetricsPath)
	require.Contains(t, body, "nvml_mock_sysfs_proc_hook_failures_total 0\n")
	require.NoError(t, os.WriteFile(cdispec.ProcHookFailures(bin), []byte("proc-hook: container a: ...\nproc-hook: container b: ...\n"), 0o644))
	_, body = s.probe(endpoints.MetricsPath)
	require.Contains(t, body, "nvml_mock_sysfs_proc_hook_failures_total 2\n")
}
