package reliability

import (
	"errors"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

const (
	// crashTrials is how many renders the crash test kills.
	crashTrials = 300
	// crashWorkers share the trials, each in a root of its own: a trial
	// mostly waits for its kill, and the others run meanwhile.
	crashWorkers = 3
	// wipeEvery starts a trial from an empty root now and then, so that
	// first renders are killed too.
	wipeEvery = 25
	// crashSeedEnv replays a run: its log names the seed it used.
	crashSeedEnv = "NVML_MOCK_SYSFS_CRASH_SEED"
)

func crashSeed(t *testing.T) uint64 {
	if s := os.Getenv(crashSeedEnv); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, crashSeedEnv)
		return seed
	}
	return uint64(time.Now().UnixNano())
}

// crashOutcome is how one killed render ended.
type crashOutcome int

const (
	finishedFirst crashOutcome = iota // exited before the kill
	killedClean                       // killed with the marker in place: before or after its changes
	killedMidway                      // killed with the marker withdrawn: inside its changes
)

// killRender starts a render and SIGKILLs it after delay.
func killRender(t *testing.T, bin, root, profile string, delay time.Duration) crashOutcome {
	t.Helper()
	cmd := exec.Command(bin, "render", "--no-binary", "--root", root, "--profile", profile)
	require.NoError(t, cmd.Start())
	time.Sleep(delay)
	_ = cmd.Process.Signal(syscall.SIGKILL)
	err := cmd.Wait()
	var ee *exec.ExitError
	if err == nil {
		return finishedFirst
	}
	require.True(t, errors.As(err, &ee), "render: %v", err)
	ws := ee.Sys().(syscall.WaitStatus)
	require.True(t, ws.Signaled(), "render failed on its own: %v", err)
	if _, err := writer.ReadMarker(os.DirFS(root)); err != nil {
		return killedMidway
	}
	return killedClean
}

// TestCrashSafety SIGKILLs the real binary at random moments of renders
// between profiles. After every kill, the consumers read the interrupted
// tree (every entry whole, go-nvlib's scan succeeds), then a render must
// succeed and give, byte for byte, the tree a clean render into an empty
// root gives: every path with its type, mode, owner, link count, content
// or link text, the writer's state directory included.
func TestCrashSafety(t *testing.T) {
	t.Parallel()
	bin := binaries.Binary(t)
	profiles := append(flipProfiles(t), "t4-vm")
	refs := map[string]map[string]string{}
	for _, p := range profiles {
		ref := filepath.Join(t.TempDir(), "ref")
		render(t, bin, ref, p, "--no-binary")
		refs[p] = overlaytest.Snapshot(t, ref, overlaytest.SnapshotOptions{})
	}
	// Kills land anywhere within a typical flip: measure the median one.
	root := filepath.Join(t.TempDir(), "root")
	render(t, bin, root, profiles[0], "--no-binary")
	var took []time.Duration
	for i := range 7 {
		start := time.Now()
		render(t, bin, root, profiles[(i+1)%len(profiles)], "--no-binary")
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	typical := took[len(took)/2]
	seed := crashSeed(t)
	t.Logf("seed %d (set %s to replay), kills within %v", seed, crashSeedEnv, typical)

	var (
		mu                      sync.Mutex
		outcomes                = map[crashOutcome]int{}
		nvlibScans, entriesRead int
	)
	t.Run("workers", func(t *testing.T) {
		for w := range crashWorkers {
			t.Run(strconv.Itoa(w), func(t *testing.T) {
				t.Parallel()
				rng := rand.New(rand.NewPCG(seed, uint64(w)))
				root := filepath.Join(t.TempDir(), "root")
				for trial := range crashTrials / crashWorkers {
					if trial%wipeEvery == 0 {
						require.NoError(t, os.RemoveAll(root))
					}
					profile := profiles[rng.IntN(len(profiles))]
					delay := time.Duration(rng.Int64N(int64(typical)))
					outcome := killRender(t, bin, root, profile, delay)
					n, read := 0, false
					if outcome == killedMidway {
						n, read = requireConsumersRead(t, root)
					}
					mu.Lock()
					outcomes[outcome]++
					if read {
						nvlibScans++
						entriesRead += n
					}
					mu.Unlock()
					next := profiles[rng.IntN(len(profiles))]
					render(t, bin, root, next, "--no-binary")
					overlaytest.RequireSameTree(t, refs[next], overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{}),
						"worker "+strconv.Itoa(w)+", trial "+strconv.Itoa(trial)+": "+profile+" killed after "+delay.String()+", then "+next)
				}
			})
		}
	})
	t.Logf("FIGURES crash: %d kills (seed %d): %d inside the changes (marker withdrawn), %d before or after them, %d renders finished first; "+
		"every following render succeeded and matched a clean render byte for byte; on the %d interrupted trees with a links directory, "+
		"go-nvlib's GetAllDevices succeeded every time and %d entries read whole",
		crashTrials, seed, outcomes[killedMidway], outcomes[killedClean], outcomes[finishedFirst], nvlibScans, entriesRead)
	require.GreaterOrEqual(t, outcomes[killedMidway], crashTrials/10, "too few kills landed inside a render to mean anything")
}

// requireConsumersRead reads an interrupted tree as consumers would, at the
// host path (the loop link resolves the same texts there): every entry of
// the links directory whole, and go-nvlib's scan without error. It reports
// false when the render was killed before the links directory existed.
func requireConsumersRead(t *testing.T, root string) (int, bool) {
	t.Helper()
	links := filepath.Join(root, plan.LinksDir)
	if _, err := os.Stat(links); errors.Is(err, fs.ErrNotExist) {
		return 0, false
	}
	res := linkscan.Links(os.DirFS(links))
	require.Empty(t, res.Torn, "the interrupted tree has torn entries")
	require.Zero(t, res.Vanished)
	_, err := nvpci.New(nvpci.WithPCIDevicesRoot(links), nvpci.WithLogger(quietLogger{})).GetAllDevices()
	require.NoError(t, err, "go-nvlib on the interrupted tree")
	return len(res.Entries), true
}
