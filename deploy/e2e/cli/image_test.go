package cli

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// podmanLimits are the ulimits podman must set here: without
// CAP_SYS_RESOURCE it cannot raise them to its defaults.
func podmanLimits() []string {
	return []string{"--ulimit", "nofile=10000:10000", "--ulimit", "nproc=1000:1000"}
}

func podmanOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("podman", args...).CombinedOutput()
	require.NoError(t, err, "podman %s: %s", strings.Join(args, " "), out)
	return strings.TrimSpace(string(out))
}

// TestImageFromScratch builds deploy/kubernetes/Dockerfile with podman,
// offline (FROM scratch pulls nothing), checks that the image holds the
// binary alone, and runs the DaemonSet's container from it as the pod
// spec has it: read-only root, no capabilities, no privilege escalation,
// the volumes bind-mounted at their paths. It probes readiness over HTTP,
// swaps the ConfigMap, and stops the container with SIGTERM.
func TestImageFromScratch(t *testing.T) {
	x := newE2E(t)
	pod, cm := daemonSetPod(t)
	c := pod.Containers[0]

	ctxDir := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(ctxDir, "bin"), 0o755))
	require.NoError(t, exec.Command("cp", x.bin, filepath.Join(ctxDir, "bin/nvml-mock-sysfs")).Run())
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(t, err)
	image := "localhost/nvml-mock-sysfs-test:" + hex.EncodeToString(b)
	began := time.Now()
	podmanOut(t, append(append([]string{"build", "--network=none"}, podmanLimits()...),
		"-t", image, "-f", "../../../deploy/kubernetes/Dockerfile", ctxDir)...)
	built := time.Since(began)
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", image).Run() })

	// The image's filesystem: the binary and nothing else.
	mnt := podmanOut(t, "image", "mount", image)
	var files []string
	require.NoError(t, filepath.WalkDir(mnt, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != mnt {
			rel, _ := filepath.Rel(mnt, p)
			files = append(files, rel)
		}
		return err
	}))
	podmanOut(t, "image", "unmount", image)
	require.Equal(t, []string{"nvml-mock-sysfs"}, files)

	// docs/user/kubernetes.md's podman steps: an image built under the name
	// containerd resolves keeps it in podman save's archive, which kind
	// load image-archive (ctr images import) names it by.
	full := "docker.io/library/nvml-mock-sysfs-test:" + hex.EncodeToString(b)
	podmanOut(t, "tag", image, full)
	t.Cleanup(func() { _ = exec.Command("podman", "rmi", "-f", full).Run() })
	archive := filepath.Join(t.TempDir(), "image.tar")
	podmanOut(t, "save", "-o", archive, full)
	manifest, err := exec.Command("tar", "-xOf", archive, "manifest.json").Output()
	require.NoError(t, err)
	var saved []struct{ RepoTags []string }
	require.NoError(t, json.Unmarshal(manifest, &saved))
	require.Len(t, saved, 1)
	require.Equal(t, []string{full}, saved[0].RepoTags, "podman save keeps the docker.io/library name")
	var layers []json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(podmanOut(t, "image", "inspect", "--format", "{{json .RootFS.Layers}}", image)), &layers))
	require.Len(t, layers, 1)

	// Negative control: no shell to run.
	out, err := exec.Command("podman", append(append([]string{"run", "--rm", "--network=none"}, podmanLimits()...),
		"--entrypoint", "/bin/sh", image, "-c", "true")...).CombinedOutput()
	require.Error(t, err, "a shell ran in the image: %s", out)

	// The DaemonSet's container.
	dir := t.TempDir()
	for _, d := range []string{"var/lib/nvml-mock-sysfs", "var/run/cdi"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, d), 0o755))
	}
	vol := podtest.NewConfigMap(t, filepath.Join(dir, "etc-nvml-mock"), "config.yaml", []byte(cm.Data["config.yaml"]))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	args := make([]string, 0, len(c.Args))
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--listen=") {
			a = "--listen=" + addr // the host's network, so pick a free port
		}
		args = append(args, a)
	}
	entrypoint, err := json.Marshal(c.Command)
	require.NoError(t, err)
	sc := c.SecurityContext
	require.True(t, *sc.ReadOnlyRootFilesystem && !*sc.AllowPrivilegeEscalation && sc.Capabilities.Drop[0] == "ALL")
	name := "nvml-mock-sysfs-test-" + hex.EncodeToString(b)
	run := append([]string{"run", "-d", "--name", name, "--network=host",
		"--read-only", "--cap-drop=all", "--security-opt=no-new-privileges", fmt.Sprintf("--user=%d", *sc.RunAsUser),
		"-v", filepath.Join(dir, "var/lib/nvml-mock-sysfs") + ":/var/lib/nvml-mock-sysfs",
		"-v", filepath.Join(dir, "var/run/cdi") + ":/var/run/cdi",
		"-v", vol.Dir + ":/etc/nvml-mock:ro",
		"--entrypoint", string(entrypoint)}, podmanLimits()...)
	podmanOut(t, append(append(run, image), args...)...)
	t.Cleanup(func() { _ = exec.Command("podman", "rm", "-f", name).Run() })
	logs := func() string { out, _ := exec.Command("podman", "logs", name).CombinedOutput(); return string(out) }

	url := "http://" + addr
	readyIn := podtest.WaitProbe(t, url+c.ReadinessProbe.HTTPGet.Path, http.StatusOK, 60*time.Second)
	root := filepath.Join(dir, "var/lib/nvml-mock-sysfs")
	require.Contains(t, effectiveProfile(t, root), "H100")
	spec, err := os.ReadFile(filepath.Join(dir, "var/run/cdi/nvml-mock-sysfs.yaml"))
	require.NoError(t, err)
	require.Contains(t, string(spec), "hostPath: /var/lib/nvml-mock-sysfs")
	installed, err := os.Stat(filepath.Join(root, plan.BinaryFile))
	require.NoError(t, err)
	require.Equal(t, int64(len(mustRead(t, x.bin))), installed.Size(), "serve installs the image's binary")

	t4, _ := shipped.Get("t4-vm")
	text, err := profile.Marshal(t4, "changed")
	require.NoError(t, err)
	swapped := time.Now()
	vol.Swap(text)
	require.Eventually(t, func() bool { return strings.Contains(effectiveProfile(t, root), "Tesla T4") }, 30*time.Second, 20*time.Millisecond, "log:\n%s", logs())
	swapIn := time.Since(swapped)
	podtest.WaitProbe(t, url+c.ReadinessProbe.HTTPGet.Path, http.StatusOK, 30*time.Second)

	grace := *pod.TerminationGracePeriodSeconds
	stopped := time.Now()
	podmanOut(t, "stop", "-t", fmt.Sprint(grace), name)
	stopIn := time.Since(stopped)
	require.Equal(t, "0", podmanOut(t, "inspect", "--format", "{{.State.ExitCode}}", name), "log:\n%s", logs())
	require.Less(t, stopIn, time.Duration(grace)*time.Second, "stopped by SIGTERM, not by the kill after the grace period")
	_, err = writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err, "the tree stays, complete")
	t.Logf("FIGURES scratch image: built in %s, 1 layer holding only the binary; container ready %s after start, swap rendered %s after it, podman stop (SIGTERM) exit 0 after %s",
		built.Round(time.Millisecond), readyIn.Round(time.Millisecond), swapIn.Round(time.Millisecond), stopIn.Round(time.Millisecond))
}

func mustRead(t *testing.T, file string) []byte {
	t.Helper()
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	return b
}
