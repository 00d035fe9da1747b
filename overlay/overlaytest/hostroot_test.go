package overlaytest

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// keepHost fails a run that leaves a new entry in a watched directory, or
// a watched directory that did not exist, and passes one that cleans up
// after itself, with the tests' own code. The watched directories here are
// temporary stand-ins for the host's.
func TestKeepHostFailsWhatARunLeaves(t *testing.T) {
	t.Parallel()
	base := t.TempDir()
	existing, missing := filepath.Join(base, "cdi"), filepath.Join(base, "kubelet")
	require.NoError(t, os.Mkdir(existing, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(existing, "there-before.yaml"), nil, 0o644))
	dirs := []string{existing, missing}
	for _, tc := range []struct {
		name  string
		run   func() error
		exit  int      // the tests' code
		code  int      // keepHost's
		names []string // in the failure message
	}{
		{name: "nothing written", code: 0},
		{name: "the tests' own failure is kept", exit: 3, code: 3},
		{name: "a file written and removed", code: 0, run: func() error {
			f := filepath.Join(existing, "spec.yaml")
			if err := os.WriteFile(f, nil, 0o644); err != nil {
				return err
			}
			return os.Remove(f)
		}},
		{name: "a file removed", code: 0, run: func() error {
			return os.Rename(filepath.Join(existing, "there-before.yaml"), filepath.Join(base, "moved"))
		}},
		{name: "a file left in a watched directory", code: 1, names: []string{"cdi/left.yaml"}, run: func() error {
			return os.WriteFile(filepath.Join(existing, "left.yaml"), nil, 0o644)
		}},
		{name: "a watched directory created", code: 1, names: []string{"kubelet", "kubelet/pods"}, run: func() error {
			return os.MkdirAll(filepath.Join(missing, "pods"), 0o755)
		}},
	} {
		var out strings.Builder
		code := keepHost(&out, dirs, func() int {
			if tc.run != nil {
				require.NoError(t, tc.run(), tc.name)
			}
			return tc.exit
		})
		require.Equal(t, tc.code, code, "%s: %s", tc.name, out.String())
		for _, n := range tc.names {
			require.Contains(t, out.String(), filepath.Join(base, n), tc.name)
		}
		if tc.names == nil {
			require.Empty(t, out.String(), tc.name)
		}
		// Each case starts from the same directories.
		require.NoError(t, os.RemoveAll(missing))
		require.NoError(t, os.RemoveAll(filepath.Join(existing, "left.yaml")))
		if _, err := os.Stat(filepath.Join(base, "moved")); err == nil {
			require.NoError(t, os.Rename(filepath.Join(base, "moved"), filepath.Join(existing, "there-before.yaml")))
		}
	}
}

// KeepHostRoot watches the host's root and the node paths a real consumer
// writes: the CDI spec directories and a kubelet's directories.
func TestKeepHostRootWatchesTheNodePaths(t *testing.T) {
	t.Parallel()
	require.ElementsMatch(t, []string{"/var/run/cdi", "/etc/cdi", "/var/lib/kubelet", "/var/log/pods", "/var/log/containers"}, watchedHostPaths())
}

// While a test holds the host paths, a snapshot (a shared lock) cannot be
// taken; once it ended, it can. Negative control: the non-blocking try
// fails during the hold.
func TestHoldHostPathsMakesSnapshotsWait(t *testing.T) {
	t.Run("held", func(t *testing.T) {
		HoldHostPaths(t)
		unlock, err := lockHost(unix.LOCK_SH | unix.LOCK_NB)
		if err == nil {
			unlock()
		}
		require.True(t, errors.Is(err, unix.EWOULDBLOCK), "a snapshot during the hold: %v", err)
	})
	// Blocking: a test binary running beside this one may hold it now.
	unlock, err := lockHost(unix.LOCK_SH)
	require.NoError(t, err, "a snapshot after the hold")
	unlock()
}
