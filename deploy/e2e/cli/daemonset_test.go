package cli

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/serve"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// nodePaths are the node paths the DaemonSet names; the tests move them
// under a temporary directory.
func nodePaths() []string {
	return []string{"/var/lib/nvml-mock-sysfs", "/var/run/cdi", "/etc/nvml-mock"}
}

// daemonSetPod reads the shipped DaemonSet and the standalone ConfigMap
// (the stand-in for nvml-mock's) strictly.
func daemonSetPod(t *testing.T) (corev1.PodSpec, corev1.ConfigMap) {
	t.Helper()
	m := podtest.DecodeManifests(t, "../../../deploy/kubernetes")
	standalone := podtest.DecodeManifests(t, "../../../deploy/kubernetes/standalone")
	return m.DaemonSets[0].Spec.Template.Spec, standalone.ConfigMaps[0]
}

// podProcess is the DaemonSet's container run as a process of the real
// binary, with its node paths under dir and its health endpoints on a free
// loopback port.
type podProcess struct {
	t      *testing.T
	cmd    *exec.Cmd
	logs   *podtest.Log
	url    string
	exited chan error
}

func startPod(t *testing.T, bin string, c corev1.Container, dir string) *podProcess {
	t.Helper()
	addr := podtest.FreeAddr(t)
	require.Equal(t, "/nvml-mock-sysfs", c.Command[0])
	here := map[string]string{}
	for _, node := range nodePaths() {
		here[node] = filepath.Join(dir, node)
	}
	args := podtest.NodeArgs(append(c.Command[1:len(c.Command):len(c.Command)], c.Args...), addr, here)
	p := &podProcess{t: t, logs: &podtest.Log{}, url: "http://" + addr, exited: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	require.NoError(t, p.cmd.Start())
	go func() { p.exited <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		select {
		case err := <-p.exited:
			p.exited <- err
		case <-time.After(10 * time.Second):
		}
	})
	return p
}

// stop sends sig and waits for the exit, at most grace.
func (p *podProcess) stop(sig syscall.Signal, grace time.Duration) (time.Duration, error) {
	p.t.Helper()
	began := time.Now()
	require.NoError(p.t, p.cmd.Process.Signal(sig))
	select {
	case err := <-p.exited:
		p.exited <- err
		return time.Since(began), err
	case <-time.After(grace):
		p.t.Fatalf("still running %s after %v; log:\n%s", grace, sig, p.logs.String())
		return 0, nil
	}
}

// markerWatch watches a rendered root's state directory, where a render
// that changes the tree first withdraws the completion marker.
type markerWatch struct {
	t    *testing.T
	w    *fsnotify.Watcher
	file string
}

func watchMarker(t *testing.T, root string) *markerWatch {
	t.Helper()
	w, err := fsnotify.NewWatcher()
	require.NoError(t, err)
	t.Cleanup(func() { _ = w.Close() })
	require.NoError(t, w.Add(filepath.Join(root, writer.StateDir)))
	return &markerWatch{t: t, w: w, file: filepath.Join(root, writer.MarkerFile)}
}

// waitRemoved waits for the marker's removal; it fails the test after
// within, naming the events it saw instead.
func (m *markerWatch) waitRemoved(within time.Duration) {
	m.t.Helper()
	deadline := time.After(within)
	var seen []string
	for {
		select {
		case ev := <-m.w.Events:
			if ev.Name == m.file && ev.Has(fsnotify.Remove) {
				return
			}
			seen = append(seen, ev.String())
		case err := <-m.w.Errors:
			m.t.Fatalf("watch of %s: %v", m.file, err)
		case <-deadline:
			m.t.Fatalf("%s not removed within %s; events seen: %v", m.file, within, seen)
		}
	}
}

func effectiveProfile(t *testing.T, root string) string {
	b, err := os.ReadFile(filepath.Join(root, plan.ProfileFile))
	require.NoError(t, err)
	return string(b)
}

// TestDaemonSetServeFollowsTheConfigMap runs the DaemonSet's own container
// command, from the shipped manifest, as a process of the real binary:
// the standalone ConfigMap in the kubelet's volume layout, then a swap to
// another profile, a bad one, a fixed one, and SIGTERM, probing through
// the manifest's own probe paths.
func TestDaemonSetServeFollowsTheConfigMap(t *testing.T) {
	bin := binaries.Binary(t)
	pod, cm := daemonSetPod(t)
	c := pod.Containers[0]
	dir := t.TempDir()
	for _, d := range []string{"var/run/cdi", "etc"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	vol := podtest.NewConfigMap(t, filepath.Join(dir, "etc/nvml-mock"), "config.yaml", []byte(cm.Data["config.yaml"]))
	root := filepath.Join(dir, "var/lib/nvml-mock-sysfs")
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second

	p := startPod(t, bin, c, dir)
	readyz := p.url + c.ReadinessProbe.HTTPGet.Path
	healthz := p.url + c.LivenessProbe.HTTPGet.Path
	readyIn := podtest.WaitProbe(t, readyz, http.StatusOK, 60*time.Second)
	code, _, err := podtest.Probe(healthz)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, effectiveProfile(t, root), "H100")
	s, err := cdi.ReadSpec(filepath.Join(dir, "var/run/cdi/nvml-mock-sysfs.yaml"), 0)
	require.NoError(t, err)
	require.Len(t, s.Devices[0].ContainerEdits.Mounts, 6, "overlay, links, the NFD path, the module view at /sys/module and at the NFD path, and the node's modules")
	bin2, err := os.ReadFile(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.NotEmpty(t, bin2, "serve installs its own binary, as render does")

	// The ConfigMap changes: serve renders the new profile.
	t4, ok := shipped.Get("t4-vm")
	require.True(t, ok)
	text, err := profile.Marshal(t4, "changed")
	require.NoError(t, err)
	swapped := time.Now()
	vol.Swap(text)
	podtest.Until(t, 30*time.Second, "the swapped profile rendered", func() (bool, string) {
		b, err := os.ReadFile(filepath.Join(root, plan.ProfileFile))
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(string(b), "Tesla T4"), fmt.Sprintf("effective profile %.200q", b)
	})
	swapIn := time.Since(swapped)
	podtest.WaitProbe(t, readyz, http.StatusOK, 30*time.Second)

	// A bad profile: not ready, the tree stays, the process stays.
	tree := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
	bad, err := os.ReadFile("../../../testdata/hostile/link-gen-is-a-float.yaml")
	require.NoError(t, err)
	vol.Swap(bad)
	podtest.WaitProbe(t, readyz, http.StatusServiceUnavailable, 30*time.Second)
	overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "after the bad profile")
	errs := p.logs.Records(t, "ERROR")
	require.Len(t, errs, 1)
	for _, want := range []string{vol.File(), "devices[0].pcie.max_link_gen", "4.5"} {
		require.Contains(t, fmt.Sprint(errs[0]["err"]), want)
	}

	// Fixed, then stopped as the kubelet stops it.
	vol.Swap([]byte(cm.Data["config.yaml"]))
	podtest.WaitProbe(t, readyz, http.StatusOK, 30*time.Second)
	marker, err := writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err)
	stopIn, err := p.stop(syscall.SIGTERM, grace)
	require.NoError(t, err, "exit 0 on SIGTERM; log:\n%s", p.logs.String())
	after, err := writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err, "the tree stays, complete")
	require.Equal(t, marker, after)
	_, err = os.Stat(filepath.Join(dir, "var/run/cdi/nvml-mock-sysfs.yaml"))
	require.NoError(t, err, "the spec stays")
	t.Logf("FIGURES the manifest's serve: ready %s after start, swapped profile rendered %s after the swap, SIGTERM exit 0 after %s (grace %s)",
		readyIn.Round(time.Millisecond), swapIn.Round(time.Millisecond), stopIn.Round(time.Millisecond), grace)
}

// TestServeStopsMidRender sends SIGTERM right after a swap, while the new
// render is about to run or running: exit 0, and the next render of the
// same root succeeds. Its negative control, SIGKILL, is not an exit 0.
func TestServeStopsMidRender(t *testing.T) {
	bin := binaries.Binary(t)
	pod, cm := daemonSetPod(t)
	c := pod.Containers[0]
	grace := time.Duration(*pod.TerminationGracePeriodSeconds) * time.Second
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			dir := t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "var/run/cdi"), 0o755))
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "etc"), 0o755))
			vol := podtest.NewConfigMap(t, filepath.Join(dir, "etc/nvml-mock"), "config.yaml", []byte(cm.Data["config.yaml"]))
			p := startPod(t, bin, c, dir)
			podtest.WaitProbe(t, p.url+c.ReadinessProbe.HTTPGet.Path, http.StatusOK, 60*time.Second)
			t4, _ := shipped.Get("t4-vm")
			text, err := profile.Marshal(t4, "changed")
			require.NoError(t, err)
			root := filepath.Join(dir, "var/lib/nvml-mock-sysfs")
			marker := watchMarker(t, root)
			vol.Swap(text)
			// The render is under way once the writer withdraws the
			// completion marker: its first change to the tree.
			marker.waitRemoved(30 * time.Second)
			took, exitErr := p.stop(sig, grace)
			_, markerErr := writer.ReadMarker(os.DirFS(root))
			if sig == syscall.SIGKILL {
				require.Error(t, exitErr, "the negative control: a killed process does not exit 0")
			} else {
				require.NoError(t, exitErr, "log:\n%s", p.logs.String())
				// A stop waits for the render in flight, up to its timeout.
				require.True(t, markerErr == nil || took >= serve.DefaultStopTimeout, "stopped after %s without finishing the render: %v", took, markerErr)
			}
			out, err := exec.Command(bin, "render", "--root", root, "--profile", vol.File()).CombinedOutput()
			require.NoError(t, err, "the next render finishes the job: %s", out)
			t.Logf("%v: exit %v after %s; marker present after the stop: %v", sig, exitErr, took.Round(time.Millisecond), markerErr == nil)
		})
	}
}
