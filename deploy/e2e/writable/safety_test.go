package writable_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
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
// as a node's does. The kill lands after a write is seen made (the state
// file exists), and leaves a whole state: the old one or the new one, as
// docs/user/writable.md documents. A new serve detaches the view, reloads
// the state file and serves the tree it describes.
func TestKilledMidWrite(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter")
	overlaytest.RequireFUSE(t)
	m := machine(t)
	gpu := m.GPUs()[0].Address.String()
	root := filepath.Join(t.TempDir(), "root")
	tree := filepath.Join(t.TempDir(), "tree")
	// Made after the directories, so its cleanup (which unmounts the dead
	// view) runs before theirs.
	ns := holdMountNamespace(t, root)
	srv := startIn(t, ns, repoProfile(t), root, tree)
	require.True(t, mountedIn(t, ns, root), "serve mounted its view in the holder's namespace")
	require.False(t, mountedIn(t, os.Getpid(), root), "and not in this test's")

	writer := srv.served(t).Reexec(t, raceChild, "--", "x", "100000")
	require.NoError(t, writer.Start())
	t.Cleanup(func() { _ = writer.Process.Kill(); _ = writer.Wait() })
	// The state file is written, beneath the view, by the first write that
	// changes the state: then the writer has begun. This test's namespace
	// has no view over the root, so it reads the file serve wrote.
	state := filepath.Join(root, writable.StateFile)
	require.Eventually(t, func() bool { _, err := os.Stat(state); return err == nil }, 20*time.Second, 5*time.Millisecond,
		"the writer made no write")
	require.NoError(t, srv.cmd.Process.Kill())
	_ = srv.cmd.Wait()
	_ = writer.Process.Kill()
	_ = writer.Wait()
	require.True(t, mountedIn(t, ns, root), "the killed serve's view is still mounted")
	_, stderr, err := hosttest.Served{Enter: ns}.Shell("stat " + root)
	require.Error(t, err, "the killed serve's view answers")
	require.Contains(t, stderr, "Transport endpoint is not connected", "the killed serve's view is dead")

	// Old or new, the state is whole: it parses, and the GPU is bound to
	// nvidia or to nothing, as a serial order of the writer's writes leaves it.
	data, err := os.ReadFile(state)
	require.NoError(t, err)
	var left struct {
		Functions map[string]plan.FunctionState `json:"functions"`
	}
	require.NoError(t, json.Unmarshal(data, &left), "the state the kill left:\n%s", data)
	want := left.Functions[gpu].Driver
	require.Contains(t, []string{"", profile.DriverNVIDIA}, want, "the GPU's driver in the state the kill left")

	srv = startIn(t, ns, repoProfile(t), root, tree)
	require.Equal(t, want, ghwDrivers(t, srv.served(t))[gpu].Driver, "the tree serve reloaded is the state's")
	srv.stop(t)
	require.False(t, mountedIn(t, ns, root), "stopped, serve leaves no view")
}

// holdMountNamespace starts a process in a private mount namespace of its
// own and returns its PID once it is in it: unshare execs before it
// unshares, so a namespace read too early is this test's, and a server
// entered there would mount on the host. The cleanup unmounts dir, lazily,
// wherever it is still mounted (a dead FUSE view, a failed run's leak),
// then ends the process, so no run leaves a mount on the host.
func holdMountNamespace(t *testing.T, dir string) int {
	t.Helper()
	holder := exec.Command("unshare", "--mount", "--propagation", "private", "sleep", "infinity")
	require.NoError(t, holder.Start())
	pid := holder.Process.Pid
	t.Cleanup(func() {
		for _, in := range []int{pid, os.Getpid()} {
			if mountedIn(t, in, dir) {
				if out, err := exec.Command("nsenter", "--target", strconv.Itoa(in), "--mount", "--", "umount", "-l", dir).CombinedOutput(); err != nil {
					t.Errorf("unmount %s in pid %d's namespace: %v: %s", dir, in, err, out)
				}
			}
		}
		_ = holder.Process.Kill()
		_ = holder.Wait()
	})
	self, err := os.Readlink("/proc/self/ns/mnt")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid))
		return err == nil && ns != self
	}, 10*time.Second, 5*time.Millisecond, "unshare made no mount namespace")
	return pid
}

// mountedIn reports whether dir is a mount point in pid's mount namespace.
func mountedIn(t *testing.T, pid int, dir string) bool {
	t.Helper()
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	require.NoError(t, err)
	return strings.Contains(string(mounts), " "+dir+" ")
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
