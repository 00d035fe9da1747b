package containerdtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// NRIPlugin is a running external NRI plugin process.
type NRIPlugin struct {
	// Name is the plugin as containerd names it: index-name.
	Name string
	// LogFile holds what the plugin printed.
	LogFile string
	cmd     *exec.Cmd
	exited  chan struct{}
	stopped bool
}

// StartNRIPlugin starts an NRI plugin whose command connects to NRISocket
// and registers as name (index-name, as containerd logs it), and waits
// until containerd reports it connected and synchronized: from then on,
// every container created passes through it. When the test ends it stops
// the plugin (SIGTERM, then SIGKILL) and waits until containerd has seen
// the connection close, so later containers are not adjusted by it.
func (h *Harness) StartNRIPlugin(t testing.TB, name string, cmd *exec.Cmd) *NRIPlugin {
	t.Helper()
	began := time.Now()
	p := &NRIPlugin{Name: name, LogFile: filepath.Join(t.TempDir(), "plugin.log"), cmd: cmd, exited: make(chan struct{})}
	log, err := os.Create(p.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	offset := h.logSize()
	if err := cmd.Start(); err != nil {
		log.Close()
		t.Fatalf("runtime: start NRI plugin %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		log.Close()
		close(p.exited)
	}()
	t.Cleanup(func() { h.StopNRIPlugin(t, p) })
	if !h.awaitLog(offset, fmt.Sprintf("plugin %q connected and synchronized", name), p.exited) {
		t.Fatalf("runtime: NRI plugin %s did not register (exited: %v)\nplugin log:\n%s\ncontainerd log:\n%s", name, cmd.ProcessState, p.Log(), h.logTail())
	}
	h.logf("NRI plugin %s (pid %d) registered in %s", name, cmd.Process.Pid, time.Since(began).Round(time.Millisecond))
	return p
}

// PID is the plugin's process.
func (p *NRIPlugin) PID() int { return p.cmd.Process.Pid }

// Log is what the plugin printed so far.
func (p *NRIPlugin) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

// StopNRIPlugin stops a plugin before the test ends (SIGTERM, then
// SIGKILL), and waits until containerd has seen its connection close.
// Stopping it twice is a no-op.
func (h *Harness) StopNRIPlugin(t testing.TB, p *NRIPlugin) {
	if p.stopped {
		return
	}
	p.stopped = true
	offset := h.logSize()
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.exited
	}
	// A containerd stopped before the test's end (Stop) has no connection
	// left to close.
	if !h.stopped && !h.awaitLog(offset, fmt.Sprintf("connection to plugin %q closed", p.Name), nil) {
		t.Errorf("runtime: containerd did not notice NRI plugin %s stop", p.Name)
	}
}

func (h *Harness) logSize() int64 {
	info, err := os.Stat(h.LogFile)
	if err != nil {
		return 0
	}
	return info.Size()
}

// awaitLog waits until containerd's log, after offset, holds message
// (as it is, or quoted in a text-format log line), giving up after
// readyTimeout or when stop closes.
func (h *Harness) awaitLog(offset int64, message string, stop <-chan struct{}) bool {
	quoted := strings.ReplaceAll(message, `"`, `\"`)
	deadline := time.Now().Add(readyTimeout)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(h.LogFile); err == nil && int64(len(b)) >= offset {
			if tail := b[offset:]; bytes.Contains(tail, []byte(message)) || bytes.Contains(tail, []byte(quoted)) {
				return true
			}
		}
		select {
		case <-stop:
			return false
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// DeviceInjectorName is containerd/nri's device-injector as containerd
// names it: index 10.
const DeviceInjectorName = "10-device-injector"

// StartDeviceInjector starts containerd/nri's device-injector on h: the
// NRI plugin that turns a pod's cdi-devices.noderesource.dev and
// mounts.noderesource.dev annotations into CDI devices and mounts. No
// registry serves it: where it is not supplied, it returns false and the
// caller reports the rows it does not run.
func (h *Harness) StartDeviceInjector(t testing.TB) (*NRIPlugin, bool) {
	t.Helper()
	bin, ok := programs.NeedSupplied(t, programs.DeviceInjector)
	if !ok {
		return nil, false
	}
	return h.StartNRIPlugin(t, DeviceInjectorName, exec.Command(bin, "-idx", "10", "-socket-path", h.NRISocket)), true
}
