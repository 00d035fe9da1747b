package reliability

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

const (
	concurrentRounds  = 10
	concurrentRenders = 4
)

// TestConcurrentRendersSerialise starts several renders of different
// profiles into one root at once, round after round. All must succeed, and
// each round must leave exactly the tree of one profile, byte for byte: an
// interleaving would leave a mix. A render that cannot get the lock in time
// must fail with one clear line and change nothing.
func TestConcurrentRendersSerialise(t *testing.T) {
	t.Parallel()
	bin := binaries.Binary(t)
	profiles := flipProfiles(t)
	refs := map[string]map[string]string{} // by marker content
	for _, p := range profiles {
		ref := filepath.Join(t.TempDir(), "ref")
		render(t, bin, ref, p, "--no-binary")
		marker, err := os.ReadFile(filepath.Join(ref, writer.MarkerFile))
		require.NoError(t, err)
		refs[string(marker)] = overlaytest.Snapshot(t, ref, overlaytest.SnapshotOptions{})
	}
	root := filepath.Join(t.TempDir(), "root")
	render(t, bin, root, profiles[0], "--no-binary")

	for round := range concurrentRounds {
		var wg sync.WaitGroup
		results := make([]result, concurrentRenders)
		for i := range concurrentRenders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = runBinary(t, bin, "render", "--no-binary", "--root", root, "--profile", profiles[(round+i)%len(profiles)])
			}()
		}
		wg.Wait()
		for _, r := range results {
			require.Equal(t, 0, r.code, "round %d: %s", round, r.stderr)
		}
		marker, err := os.ReadFile(filepath.Join(root, writer.MarkerFile))
		require.NoError(t, err)
		ref, ok := refs[string(marker)]
		require.True(t, ok, "round %d: the marker names neither profile: %s", round, marker)
		overlaytest.RequireSameTree(t, ref, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{}), fmt.Sprintf("round %d", round))
	}

	// Hold the lock as a running render does.
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Flock(fd, unix.LOCK_EX))
	before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
	r := runBinary(t, bin, "render", "--no-binary", "--root", root, "--profile", profiles[1], "--lock-timeout", "300ms")
	require.Equal(t, 1, r.code)
	require.Equal(t, "nvml-mock-sysfs: render into "+root+": another render holds the lock on "+root+"; gave up after 300ms\n", r.stderr)
	overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "a render that got no lock changed the tree")
	t.Logf("FIGURES concurrency: %d rounds of %d simultaneous renders, each round left exactly one profile's tree", concurrentRounds, concurrentRenders)
}

// TestRenderedTreeIsSafe renders every built-in with the real binary under
// umask 077, and with the node's own devices merged in: every directory is
// 0755, every file 0644 (the installed binary 0755), nothing is special or
// set-uid, and every link resolves inside the overlay, except host devices'
// links, which lead into the real /sys/devices as the kernel's do, and the
// module view's stand-ins for the node's modules, into the real /sys/module.
func TestRenderedTreeIsSafe(t *testing.T) {
	t.Parallel()
	bin := binaries.Binary(t)
	hostDevices, _ := filepath.Glob(sysfs.KernelLinksDir + "/*")
	for _, p := range []string{"dgx-a100", "hgx-h100", "gb200-tray", "t4-vm", "hgx-h100 --host-devices merge"} {
		t.Run(p, func(t *testing.T) {
			t.Parallel()
			args := strings.Fields(p)
			if len(args) > 1 && len(hostDevices) == 0 {
				overlaytest.Missing(t, "this machine has no PCI devices in %s to merge", sysfs.KernelLinksDir)
			}
			root := filepath.Join(t.TempDir(), "root")
			argv := append([]string{"sh", bin, "render", "--root", root, "--profile"}, args...)
			cmd := exec.Command("sh", append([]string{"-c", `umask 077 && exec "$@"`}, argv...)...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s", out)
			links, hostLinks := 0, 0
			require.NoError(t, filepath.Walk(root, func(path string, info os.FileInfo, err error) error {
				if err != nil {
					return err
				}
				mode := info.Mode()
				switch {
				case mode.IsDir():
					require.Equal(t, os.FileMode(0o755)|os.ModeDir, mode, path)
				case mode.IsRegular():
					want := os.FileMode(0o644)
					if path == filepath.Join(root, "bin/nvml-mock-sysfs") {
						want = 0o755
					}
					require.Equal(t, want, mode, path)
				case mode&os.ModeSymlink != 0:
					links++
					real, err := filepath.EvalSymlinks(path)
					require.NoError(t, err, "%s dangles", path)
					switch {
					case strings.HasPrefix(real+"/", root+"/"):
					case filepath.Dir(path) == filepath.Join(root, plan.HostModulesDir) || filepath.Dir(path) == filepath.Join(root, plan.ModulesDir):
						// The module view's links to the node's own modules,
						// through the stand-ins for the node's /sys/module
						// mount (docs/design/modules.md), lead to the node
						// module of the same name, whatever the flags.
						require.Equal(t, "/sys/module/"+filepath.Base(path), real, "%s resolves outside the overlay, not to its node module", path)
					default:
						require.True(t, len(args) > 1 && strings.HasPrefix(real, "/sys/devices/"), "%s resolves to %s, outside the overlay", path, real)
						hostLinks++
					}
				default:
					t.Errorf("%s is special: %v", path, mode)
				}
				return nil
			}))
			require.Positive(t, links)
			require.Equal(t, len(args) > 1, hostLinks > 0, "%d links lead to the host's devices", hostLinks)
		})
	}
}
