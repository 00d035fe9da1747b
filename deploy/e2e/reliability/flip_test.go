package reliability

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// The flip test's bounds: it flips until both minimums are met, and gives
// up (failing) if the reader is starved for maxFlips flips.
const (
	minFlips = 200
	minScans = 5000
	maxFlips = 5000
	// nvlibVerifyEvery also checks go-nvlib's view after every so many flips.
	nvlibVerifyEvery = 10
)

// flipProfiles share 0000:07:00.0 with other ids, differ in other devices
// and in hierarchy, so that anchors move on every flip.
func flipProfiles(t testing.TB) []string {
	dir := filepath.Join(overlaytest.Repo(t), "testdata", "flip")
	return []string{filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")}
}

// expectedView is what a reader must see once a render of a profile is done.
type expectedView struct {
	entries map[string]linkscan.Entry
	gpus    []string
}

func expectView(t testing.TB, profile string) expectedView {
	t.Helper()
	p, err := overlay.Plan(overlay.Options{Profile: profile})
	require.NoError(t, err)
	files := map[string]string{}
	for _, e := range p.Entries {
		if e.Kind == plan.File {
			files[e.Path] = string(e.Data)
		}
	}
	v := expectedView{entries: map[string]linkscan.Entry{}}
	for _, n := range p.Tree.Nodes() {
		dir := "sys/" + n.SysPath() + "/"
		v.entries[n.Address.String()] = linkscan.Entry{Vendor: files[dir+"vendor"], Class: files[dir+"class"], Resource: files[dir+"resource"]}
	}
	for _, g := range p.Machine.GPUs() {
		v.gpus = append(v.gpus, g.Address.String())
	}
	return v
}

// reader is the scanning child in its mount namespace.
type reader struct {
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr *bytes.Buffer
}

func startReader(t *testing.T, root string) *reader {
	t.Helper()
	r := &reader{stderr: &bytes.Buffer{}}
	r.cmd = hosttest.Served{Root: root}.Reexec(t, scannerMode)
	r.cmd.Stderr = r.stderr
	var err error
	r.in, err = r.cmd.StdinPipe()
	require.NoError(t, err)
	out, err := r.cmd.StdoutPipe()
	require.NoError(t, err)
	r.out = bufio.NewReader(out)
	require.NoError(t, r.cmd.Start())
	t.Cleanup(func() {
		r.in.Close()
		if r.cmd.ProcessState == nil {
			r.cmd.Process.Kill()
			r.cmd.Wait()
		}
	})
	rep := r.receive(t)
	require.True(t, rep.Ready, "reader did not start")
	return r
}

func (r *reader) receive(t *testing.T) scannerReply {
	t.Helper()
	line, err := r.out.ReadBytes('\n')
	require.NoError(t, err, "reader: %s", r.stderr)
	var rep scannerReply
	require.NoError(t, json.Unmarshal(line, &rep))
	return rep
}

func (r *reader) send(t *testing.T, cmd string) scannerReply {
	t.Helper()
	_, err := io.WriteString(r.in, cmd+"\n")
	require.NoError(t, err, "reader: %s", r.stderr)
	return r.receive(t)
}

// TestFlipUnderLiveReaders flips a mounted overlay between two profiles
// with the real binary while a reader in a private mount namespace scans
// /sys/bus/pci/devices as go-nvlib does. No scan may see a dangling entry
// or an empty or partial file, and after every flip the reader must see
// exactly the new profile, through its own reads and through go-nvlib.
func TestFlipUnderLiveReaders(t *testing.T) {
	overlaytest.RequireRoot(t)
	t.Parallel()
	bin := binaries.Binary(t)
	// Where overlaytest.Main keeps temporary files, a tmpfs when it can:
	// renders there take a few milliseconds rather than a node disk's
	// tenth of a second, so the reader's walks cross more of each render's
	// steps, and the writer's settle steps must cover walks in flight.
	root := filepath.Join(t.TempDir(), "overlay")
	profiles := flipProfiles(t)
	views := []expectedView{expectView(t, profiles[0]), expectView(t, profiles[1])}
	render(t, bin, root, profiles[0], "--no-binary")
	r := startReader(t, root)

	flips, scans, nvlibVerified := 0, 0, 0
	var rendering, verifying time.Duration
	for flips < minFlips || scans < minScans {
		require.Less(t, flips, maxFlips, "the reader managed only %d scans in %d flips", scans, flips)
		next := (flips + 1) % 2
		start := time.Now()
		render(t, bin, root, profiles[next], "--no-binary")
		flips++
		rendering += time.Since(start)
		start = time.Now()
		cmd := "verify"
		if flips%nvlibVerifyEvery == 0 {
			cmd = "verify nvlib"
			nvlibVerified++
		}
		v := r.send(t, cmd).Verify
		verifying += time.Since(start)
		require.NotNil(t, v)
		scans = v.Scans
		require.Empty(t, v.Scan.Torn, "after flip %d", flips)
		require.Equal(t, views[next].entries, v.Scan.Entries, "after flip %d to %s the reader sees another tree", flips, profiles[next])
		if cmd == "verify nvlib" {
			require.Empty(t, v.NvlibErr, "go-nvlib after flip %d", flips)
			require.Equal(t, views[next].gpus, v.NvlibGPUs, "go-nvlib's GPUs after flip %d", flips)
		}
	}
	st := r.send(t, "stop").Stats
	require.NotNil(t, st)
	require.NoError(t, r.cmd.Wait(), "reader: %s", r.stderr)
	t.Logf("FIGURES flip: renders took %v, verifications %v; go-nvlib verified the new tree after %d flips", rendering, verifying, nvlibVerified)
	t.Logf("FIGURES flip: %d flips, %d scans, %d entries and %d files read, %d entries vanished mid-scan, %d torn; go-nvlib %d scans, %d failed on a removed entry, %d other failures",
		flips, st.Scans, st.Entries, st.Files, st.Vanished, st.Torn, st.NvlibScans, st.NvlibVanished, st.NvlibFailures)
	require.Zero(t, st.Torn, "torn reads, first ones:\n%v", st.Samples)
	require.Zero(t, st.NvlibFailures, "go-nvlib failures, first ones:\n%v", st.NvlibSamples)
}
