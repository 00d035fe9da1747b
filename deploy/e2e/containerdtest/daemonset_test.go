package containerdtest_test

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

const (
	// manifestDir holds the shipped manifests.
	manifestDir = "../../kubernetes"
)

// kubeletContainer is the DaemonSet pod's only container, in the CRI
// config a kubelet makes of it, with its probes' URLs.
type kubeletContainer struct {
	containerdtest.Container
	readyz, healthz string
	grace           time.Duration
}

// translate does what a kubelet does with the pod spec's container, for a
// run on this machine rather than a node. A hostPath volume is the
// directory nodeDirs names for its path, mounted at that same directory
// (the manifest mounts each at its node path, so the CDI spec serve writes
// names host paths; here both sides move) and the args that name the node
// path name it too. A ConfigMap volume is the directory configMaps names
// for it, in the kubelet's ..data layout, at its mount path. The pod has
// the host network (there is no CNI here), so --listen moves to listen,
// and the probes are URLs on it. The image is asked for by the manifest's
// own name.
func translate(t *testing.T, spec corev1.PodSpec, nodeDirs, configMaps map[string]string, listen string) kubeletContainer {
	t.Helper()
	require.Len(t, spec.Containers, 1)
	c := spec.Containers[0]
	mounts := map[string]containerdtest.Mount{} // volume name -> its mount; a ConfigMap's without its path
	nodePath := map[string]string{}             // volume name -> its hostPath
	here := map[string]string{}
	for _, v := range spec.Volumes {
		switch {
		case v.HostPath != nil:
			dir, ok := nodeDirs[v.HostPath.Path]
			require.True(t, ok, "volume %s: no directory for hostPath %s", v.Name, v.HostPath.Path)
			here[v.HostPath.Path] = dir
			nodePath[v.Name] = v.HostPath.Path
			mounts[v.Name] = containerdtest.Mount{HostPath: dir, ContainerPath: dir}
		case v.ConfigMap != nil:
			dir, ok := configMaps[v.ConfigMap.Name]
			require.True(t, ok, "volume %s: no directory for ConfigMap %s", v.Name, v.ConfigMap.Name)
			mounts[v.Name] = containerdtest.Mount{HostPath: dir}
		default:
			t.Fatalf("volume %s: only hostPath and configMap volumes are translated", v.Name)
		}
	}
	k := kubeletContainer{Container: containerdtest.Container{
		Name:    c.Name,
		Image:   c.Image,
		Command: c.Command,
		Args:    podtest.NodeArgs(c.Args, listen, here),
	}}
	for _, vm := range c.VolumeMounts {
		m, ok := mounts[vm.Name]
		require.True(t, ok, "volumeMount %s: no such volume", vm.Name)
		require.Empty(t, vm.SubPath, "volumeMount %s: subPath is not translated", vm.Name)
		if node, ok := nodePath[vm.Name]; ok {
			require.Equal(t, node, vm.MountPath, "volumeMount %s: a hostPath volume is mounted at its node path", vm.Name)
		} else {
			m.ContainerPath = vm.MountPath
		}
		m.ReadOnly = vm.ReadOnly
		k.Mounts = append(k.Mounts, m)
	}
	for _, e := range c.Env {
		require.Nil(t, e.ValueFrom, "env %s: valueFrom is not translated", e.Name)
		k.Env = append(k.Env, e.Name+"="+e.Value)
	}
	if sc := c.SecurityContext; sc != nil {
		k.Security.ReadOnlyRootfs = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		k.Security.NoNewPrivs = sc.AllowPrivilegeEscalation != nil && !*sc.AllowPrivilegeEscalation
		k.Security.RunAsUser = sc.RunAsUser
		if sc.Capabilities != nil {
			require.Empty(t, sc.Capabilities.Add, "capabilities.add is not translated")
			for _, c := range sc.Capabilities.Drop {
				k.Security.DropCapabilities = append(k.Security.DropCapabilities, string(c))
			}
		}
	}
	// The probes name the port by name; serve listens on it.
	require.Len(t, c.Ports, 1)
	require.Contains(t, c.Args, fmt.Sprintf("--listen=:%d", c.Ports[0].ContainerPort))
	url := func(p *corev1.Probe) string {
		require.NotNil(t, p)
		require.NotNil(t, p.HTTPGet)
		require.Equal(t, c.Ports[0].Name, p.HTTPGet.Port.String())
		return "http://" + listen + p.HTTPGet.Path
	}
	k.readyz, k.healthz = url(c.ReadinessProbe), url(c.LivenessProbe)
	k.grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
	return k
}

// readerScans is how many whole scans of a tree the reader makes before
// the test moves on: more than one, so that a view is no lucky moment.
const readerScans = 4

// waitReaderScans waits until the reader's latest view is a tree of
// entries entries, scanned whole scans times in a row, by its own count.
func waitReaderScans(t *testing.T, reader *containerdtest.CRIContainer, entries, scans int) {
	t.Helper()
	// crictl runs for each look: a tenth of a second between them.
	_, err := podtest.Poll(30*time.Second, 100*time.Millisecond, func() (bool, string) {
		out, errOut := reader.Logs(t)
		views, err := containerdtest.ParseReaderViews(out)
		switch {
		case err != nil:
			return false, err.Error()
		case len(views) == 0:
			return false, fmt.Sprintf("no progress line yet; log %.300q %.300q", out, errOut)
		}
		last := views[len(views)-1]
		return last.Entries == entries && last.Scans >= scans, fmt.Sprintf("views %+v", views)
	})
	require.NoError(t, err, "the reader's %d whole scans of the tree of %d entries", scans, entries)
}

// TestDaemonSetPod runs the DaemonSet's own pod, decoded strictly from the
// shipped manifest, through containerd's CRI as a kubelet runs it: the
// scratch image of the Dockerfile's recipe, the example ConfigMap in the
// kubelet's volume layout, the hostPath volumes on temporary directories,
// the CDI spec directory containerd reads. Then: the tree and spec appear
// and a CDI-served verify passes; a ConfigMap swap re-renders while a
// served reader scans; a bad profile keeps the old tree and makes the pod
// not-ready until it is fixed; a kubelet's stop (SIGTERM) exits 0 and
// leaves the tree.
func TestDaemonSetPod(t *testing.T) {
	h := containerdtest.Start(t, containerdtest.Options{})
	m := podtest.DecodeManifests(t, manifestDir)
	require.Len(t, m.DaemonSets, 1)
	// nvml-mock's ConfigMap, which the DaemonSet mounts, as the standalone
	// example makes it.
	standalone := podtest.DecodeManifests(t, manifestDir+"/standalone")
	require.Len(t, standalone.ConfigMaps, 1)
	ds, cm := m.DaemonSets[0], standalone.ConfigMaps[0]
	spec := ds.Spec.Template.Spec
	require.Len(t, cm.Data, 1)
	var key, text string
	for k, v := range cm.Data {
		key, text = k, v
	}

	bin := hosttest.BuildBinary(t)
	h.Import(t, containerdtest.BinaryImage(t, containerdtest.NormalizedImage(spec.Containers[0].Image), bin), containerdtest.CRINamespace)
	h.Import(t, containerdtest.BinaryImage(t, verifyImage, bin), containerdtest.CRINamespace)
	h.Import(t, containerdtest.ReaderBaseImage(t), containerdtest.CRINamespace)

	dir := t.TempDir()
	overlay := filepath.Join(dir, "overlay")
	require.NoError(t, os.Mkdir(overlay, 0o755)) // DirectoryOrCreate
	vol := podtest.NewConfigMap(t, filepath.Join(dir, "configmap"), key, []byte(text))
	k := translate(t, spec,
		map[string]string{"/var/lib/nvml-mock-sysfs": overlay, "/var/run/cdi": h.CDIDir},
		map[string]string{cm.Name: vol.Dir},
		podtest.FreeAddr(t))
	specFile := filepath.Join(h.CDIDir, "nvml-mock-sysfs.yaml")

	// Negative control: nothing answers before the pod runs.
	_, _, err := podtest.Probe(k.readyz)
	require.Error(t, err)

	sandbox := h.RunPod(t, containerdtest.Pod{Name: ds.Name, Namespace: ds.Namespace})
	started := time.Now()
	render := sandbox.Start(t, k.Container)
	logs := func() *podtest.Log {
		var l podtest.Log
		stdout, stderr := render.Logs(t)
		_, _ = l.Write([]byte(stdout + stderr))
		return &l
	}
	podtest.WaitProbe(t, k.readyz, http.StatusOK, 60*time.Second)
	readyIn := time.Since(started)
	code, _, err := podtest.Probe(k.healthz)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)

	facts := func(t *testing.T, name string, text []byte) *profilefacts.Profile {
		p, err := profilefacts.Parse(name, text)
		require.NoError(t, err)
		return p
	}
	links := os.DirFS(filepath.Join(overlay, plan.LinksDir))
	s := &served{h: h, bin: bin, root: overlay, spec: specFile, profile: vol.File(), facts: facts(t, key, []byte(text)),
		containerRoot: podtest.FlagValue(spec.Containers[0].Args, "--container-root")}

	t.Run("the tree and the spec appear, and serve a CDI pod", func(t *testing.T) {
		_, err := writer.ReadMarker(os.DirFS(overlay))
		require.NoError(t, err, "the tree is complete in the hostPath directory")
		cdiSpec, err := cdi.ReadSpec(specFile, 0)
		require.NoError(t, err, "the spec is in the directory containerd reads")
		require.NotEmpty(t, cdiSpec.Devices)
		hosttest.RequireMountSet(t, cdiSpec.Devices[0].ContainerEdits.Mounts, overlay, spec.Containers[0].Args)
		pod := h.RunPod(t, containerdtest.Pod{Name: "daemonset-verify"})
		c := s.verifyContainer("verify")
		c.CDIDevices = []string{device}
		res := pod.Run(t, c)
		s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))

		// Negative control: the same container without the device.
		res = pod.Run(t, s.unservedContainer("plain"))
		require.Equal(t, 1, res.ExitCode)
		require.Contains(t, report(t, res.ExitCode, res.Stdout, res.Stderr).FailedChecks(), verify.LinksMount)
	})

	t4, ok := shipped.Get("t4-vm")
	require.True(t, ok)
	t4Text, err := profile.Marshal(t4, "changed")
	require.NoError(t, err)
	t4Facts := facts(t, "t4-vm", t4Text)
	var swapIn time.Duration
	var totals containerdtest.ReaderTotals
	before := len(linkscan.Links(links).Entries)

	t.Run("a ConfigMap swap re-renders under a served reader", func(t *testing.T) {
		reader := h.RunPod(t, containerdtest.Pod{Name: "daemonset-reader"}).Start(t, containerdtest.Container{
			Name: "reader", Image: containerdtest.ReaderImage, CDIDevices: []string{device},
		})
		// The reader lives through the re-render once it has scanned the
		// first tree whole a few times, by its own count.
		waitReaderScans(t, reader, before, readerScans)
		old, err := writer.ReadMarker(os.DirFS(overlay))
		require.NoError(t, err)
		swapped := time.Now()
		vol.Swap(t4Text)
		// Rendered: the new tree's completion marker, written last.
		_, err = podtest.Poll(30*time.Second, 20*time.Millisecond, func() (bool, string) {
			m, err := writer.ReadMarker(os.DirFS(overlay))
			if err != nil {
				return false, err.Error()
			}
			return m.Digest != old.Digest && m.GPUs == len(t4Facts.GPUs), fmt.Sprintf("marker %+v", m)
		})
		require.NoError(t, err, "the swapped profile rendered; log:\n%s", logs().String())
		swapIn = time.Since(swapped)
		podtest.WaitProbe(t, k.readyz, http.StatusOK, 30*time.Second)
		after := len(linkscan.Links(links).Entries)
		require.NotEqual(t, before, after)
		waitReaderScans(t, reader, after, readerScans)
		reader.Stop(t, k.grace)
		require.Equal(t, 0, reader.Wait(t, 30*time.Second))
		out, _ := reader.Logs(t)
		totals, err = containerdtest.ParseReaderTotals(out)
		require.NoError(t, err)
		reader.Remove(t)
		require.Zero(t, totals.Torn, "torn reads: %v", totals.Samples)
		require.Positive(t, totals.Scans)
		require.GreaterOrEqual(t, len(totals.Views), 2, "the reader saw the first tree and the new one")
		require.Equal(t, before, totals.Views[0])
		require.Equal(t, after, totals.Views[len(totals.Views)-1])
	})

	var notReadyIn, readyAgainIn time.Duration
	t.Run("a bad profile keeps the old tree served and the pod not ready", func(t *testing.T) {
		tree := overlaytest.Snapshot(t, overlay, overlaytest.SnapshotOptions{Identity: true})
		bad, err := os.ReadFile("../../../testdata/hostile/link-gen-is-a-float.yaml")
		require.NoError(t, err)
		swapped := time.Now()
		vol.Swap(bad)
		podtest.WaitProbe(t, k.readyz, http.StatusServiceUnavailable, 30*time.Second)
		notReadyIn = time.Since(swapped)
		code, _, err := podtest.Probe(k.healthz)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, code, "alive: not a crash loop")
		overlaytest.RequireSameTree(t, tree, overlaytest.Snapshot(t, overlay, overlaytest.SnapshotOptions{Identity: true}), "after the bad profile")
		errs := logs().Records(t, "ERROR")
		require.Len(t, errs, 1)
		for _, want := range []string{"devices[0].pcie.max_link_gen", "4.5"} {
			require.Contains(t, fmt.Sprint(errs[0]["err"]), want)
		}

		// The old tree still serves a CDI pod, as the t4 it is.
		s.facts = t4Facts
		c := s.verifyContainer("verify-while-bad")
		c.CDIDevices = []string{device}
		res := h.RunPod(t, containerdtest.Pod{Name: "daemonset-verify-bad"}).Run(t, c)
		s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))

		fixed := time.Now()
		vol.Swap(t4Text)
		podtest.WaitProbe(t, k.readyz, http.StatusOK, 30*time.Second)
		readyAgainIn = time.Since(fixed)
	})

	t.Run("a kubelet's stop exits 0 and leaves the tree", func(t *testing.T) {
		marker, err := writer.ReadMarker(os.DirFS(overlay))
		require.NoError(t, err)
		stopped := time.Now()
		render.Stop(t, k.grace)
		code := render.Wait(t, 30*time.Second)
		stopIn := time.Since(stopped)
		require.Equal(t, 0, code, "exit 0 on SIGTERM; log:\n%s", logs().String())
		require.Less(t, stopIn, k.grace, "stopped by SIGTERM, not by the SIGKILL after the grace period")
		after, err := writer.ReadMarker(os.DirFS(overlay))
		require.NoError(t, err, "the tree stays, complete")
		require.Equal(t, marker, after)
		_, err = os.Stat(specFile)
		require.NoError(t, err, "the spec stays")
		_, _, err = podtest.Probe(k.readyz)
		require.Error(t, err, "nothing answers once it stopped")
		t.Logf("the pod's log:\n%s", logs().String())
		t.Logf("FIGURES DaemonSet pod under containerd CRI: ready %s after start; ConfigMap swap rendered %s after it, reader %d scans (%d entries, %d files read), %d torn, %d vanished, views %v; bad profile not-ready %s after the swap, ready %s after the fix; StopContainer (SIGTERM, grace %s) exit %d after %s",
			readyIn.Round(time.Millisecond), swapIn.Round(time.Millisecond), totals.Scans, totals.Entries, totals.Files, totals.Torn, totals.Vanished, totals.Views,
			notReadyIn.Round(time.Millisecond), readyAgainIn.Round(time.Millisecond), k.grace, code, stopIn.Round(time.Millisecond))
	})
}
