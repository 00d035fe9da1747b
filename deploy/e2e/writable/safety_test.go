package writable_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writable"
)

// raceChild unbinds the first GPU from nvidia and binds it back n times,
// by plain writes, and prints what each write answered.
const raceChild = "race"

// raced is what a race child saw.
type raced struct {
	Unbound, Bound int // writes that succeeded
	Refused        int // ENODEV (unbind of an unbound GPU) or EBUSY (bind of a bound one)
	Other          []string
}

func race(m *profile.Machine, n int) int {
	gpu := m.GPUs()[0].Address.String()
	var r raced
	for range n {
		for _, op := range []string{"unbind", "bind"} {
			err := os.WriteFile("/sys/bus/pci/drivers/nvidia/"+op, []byte(gpu), 0)
			switch {
			case err == nil && op == "unbind":
				r.Unbound++
			case err == nil:
				r.Bound++
			case errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.EBUSY):
				r.Refused++
			default:
				r.Other = append(r.Other, err.Error())
			}
		}
	}
	if err := json.NewEncoder(os.Stdout).Encode(r); err != nil {
		return 1
	}
	return 0
}

// TestConcurrentWriters: two containers bind and unbind the same GPU at
// once. Every write gets an answer a serial order of them gives: the
// successful unbinds and binds alternate, so they differ by at most one,
// and the GPU ends bound exactly when they are equal; the state file says
// the same.
func TestConcurrentWriters(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	m := machine(t)
	root := filepath.Join(t.TempDir(), "root")
	srv := start(t, repoProfile(t), root, filepath.Join(t.TempDir(), "tree"))
	served := srv.served(t)
	const n = 40
	var cmds [2]*strings.Builder
	done := make(chan error, 2)
	for i := range cmds {
		cmds[i] = &strings.Builder{}
		cmd := served.Reexec(t, raceChild, "--", "x", fmt.Sprint(n))
		cmd.Stdout = cmds[i]
		require.NoError(t, cmd.Start())
		go func() { done <- cmd.Wait() }()
	}
	for range cmds {
		require.NoError(t, <-done)
	}
	var total raced
	for _, out := range cmds {
		var r raced
		require.NoError(t, json.Unmarshal([]byte(out.String()), &r), out.String())
		require.Empty(t, r.Other, "answers no serial order gives")
		total.Unbound += r.Unbound
		total.Bound += r.Bound
		total.Refused += r.Refused
	}
	t.Logf("%d unbinds and %d binds succeeded, %d refused, of %d writes", total.Unbound, total.Bound, total.Refused, 4*n)
	require.Equal(t, 4*n, total.Unbound+total.Bound+total.Refused)
	require.Contains(t, []int{0, 1}, total.Unbound-total.Bound, "a serial order alternates them, starting bound")
	want := profile.DriverNVIDIA
	if total.Unbound > total.Bound {
		want = ""
	}
	gpu := m.GPUs()[0].Address.String()
	require.Equal(t, want, ghwDrivers(t, served)[gpu].Driver, "the tree")
	srv.stop(t)
	state, err := os.ReadFile(filepath.Join(root, writable.StateFile))
	require.NoError(t, err)
	if want == "" {
		require.NotContains(t, string(state), `"driver": "nvidia"`, "the state file")
	} else {
		require.Contains(t, string(state), `"driver": "nvidia"`, "the state file")
	}
}

// TestKilledMidWrite: serve killed (SIGKILL) while a container writes
// leaves a dead view over the root, in a mount namespace that outlives it
// as a node's does. A new serve detaches the view, reloads the state file
// and serves the tree it describes.
func TestKilledMidWrite(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	m := machine(t)
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "infinity")
	require.NoError(t, holder.Start())
	t.Cleanup(func() { _ = holder.Process.Kill(); _ = holder.Wait() })
	root := filepath.Join(t.TempDir(), "root")
	tree := filepath.Join(t.TempDir(), "tree")
	srv := startIn(t, holder.Process.Pid, repoProfile(t), root, tree)
	writer := srv.served(t).Reexec(t, raceChild, "--", "x", "100000")
	require.NoError(t, writer.Start())
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, srv.cmd.Process.Kill())
	_ = srv.cmd.Wait()
	_ = writer.Process.Kill()
	_ = writer.Wait()
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid))
	require.NoError(t, err)
	require.Contains(t, string(mounts), " "+root+" ", "the killed serve's view is still mounted, dead")

	srv = startIn(t, holder.Process.Pid, repoProfile(t), root, tree)
	state, err := os.ReadFile(filepath.Join(root, writable.StateFile))
	require.NoError(t, err, "the writes before the kill left a state")
	want := ""
	if strings.Contains(string(state), `"driver": "nvidia"`) {
		want = profile.DriverNVIDIA
	}
	gpu := m.GPUs()[0].Address.String()
	require.Equal(t, want, ghwDrivers(t, srv.served(t))[gpu].Driver, "the tree serve reloaded is the state's")
	srv.stop(t)
	mounts, err = os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", holder.Process.Pid))
	require.NoError(t, err)
	require.NotContains(t, string(mounts), " "+root+" ", "stopped, serve leaves no view")
}

// TestNodeOwnUntouched: a write naming the node's own device or driver
// fails: its drivers are listed read-only beside the mock ones, and its
// devices are no function of the tree.
func TestNodeOwnUntouched(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	drivers, err := os.ReadDir("/sys/bus/pci/drivers")
	require.NoError(t, err)
	devices, err := os.ReadDir("/sys/bus/pci/devices")
	require.NoError(t, err)
	if len(drivers) == 0 || len(devices) == 0 {
		overlaytest.Missing(t, "this machine has no PCI driver or device of its own to name")
	}
	srv := start(t, repoProfile(t), filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "tree"))
	served := srv.served(t)
	own, dev := drivers[0].Name(), devices[0].Name()
	// dd, not the shell's echo: dash says "I/O error" for every failed
	// write, whatever the errno.
	_, stderr, err := served.Shell(fmt.Sprintf("ls /sys/bus/pci/drivers/%[1]s/ >/dev/null && echo %[2]s | dd status=none of=/sys/bus/pci/drivers/%[1]s/unbind", own, dev))
	require.Error(t, err, "unbinding the node's %s from its own %s", dev, own)
	require.Contains(t, stderr, "Read-only file system")
	_, stderr, err = served.Shell(fmt.Sprintf("echo %s | dd status=none of=/sys/bus/pci/drivers/vfio-pci/bind", dev))
	require.Error(t, err, "binding the node's %s to the mock vfio-pci", dev)
	require.Contains(t, stderr, "No such device")
}
