package containerdtest_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// startServeNRI runs serve --nri with flags on s's tree, or, unrendered,
// on a root it cannot render.
func (s *served) startServeNRI(t testing.TB, unrendered bool, flags ...string) *containerdtest.ServeNRI {
	t.Helper()
	return s.h.StartServeNRI(t, s.bin, containerdtest.ServeNRIOptions{Root: s.root, Profile: s.profile, Unrendered: unrendered, Flags: flags})
}

// requireUnservedIn runs an unserved verify container in a new pod and
// requires it to fail for want of our links directory.
func (s *served) requireUnservedIn(t *testing.T, pod containerdtest.Pod, name string) {
	t.Helper()
	code, r := s.verifyIn(t, pod, s.unservedContainer(name))
	requireUnserved(t, code, r)
}

// requireUnserved requires a verify that failed for want of our links
// directory: the container was not served.
func requireUnserved(t *testing.T, code int, r interface{ FailedChecks() []string }) {
	t.Helper()
	require.Equal(t, 1, code)
	require.Contains(t, r.FailedChecks(), verify.LinksMount)
}

// testServeNRI serves pods that ask for nothing, or by annotation, through
// serve --nri: no device-injector, no hostPath of ours. Each mode's plugin
// is connected only while its subtest runs.
func testServeNRI(t *testing.T, s *served) {
	const route = "NRI serve --nri"
	node := route + " (node-wide, the default)"
	t.Run("node-wide", func(t *testing.T) {
		n := s.startServeNRI(t, false)
		t.Run("a pod that asks for nothing", func(t *testing.T) {
			s.routes.expect(t, node, "nothing", "verify passes")
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-plain"}, s.verifyContainer("gfd"))
			s.requireAllGreen(t, code, r)
		})
		t.Run("the node's /sys at /sys", func(t *testing.T) {
			s.routes.expect(t, node, "nothing; the node's `/sys` mounted at `/sys` (GFD's own chart)", "verify passes: ours on top of it")
			c := s.verifyContainer("gfd")
			c.Mounts = append(c.Mounts, containerdtest.Mount{HostPath: "/sys", ContainerPath: "/sys"})
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-host-sys"}, c)
			s.requireAllGreen(t, code, r)
		})
		t.Run("opted out", func(t *testing.T) {
			s.routes.expect(t, node, "`nvml-mock.nvidia.com/inject: \"false\"` (nvml-mock's opt-out)", "verify fails: no links directory mounted")
			s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-opt-out", Annotations: map[string]string{nriplugin.NVMLMockInjectAnnotation: "false"}}, "gfd")
		})
		t.Run("kube-system", func(t *testing.T) {
			s.routes.expect(t, node, "nothing, in `kube-system`", "verify fails: no links directory mounted")
			s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-system", Namespace: "kube-system"}, "proxy")
		})
		t.Run("another mock's view", func(t *testing.T) {
			s.routes.expect(t, node, "nothing; another mock's tree mounted at `/sys/devices`", "left as it is, serve logs it: verify fails")
			other := filepath.Join(t.TempDir(), "sys-devices")
			require.NoError(t, os.MkdirAll(filepath.Join(other, "system/cpu"), 0o755))
			c := s.unservedContainer("other")
			c.Mounts = append(c.Mounts, containerdtest.Mount{HostPath: other, ContainerPath: cdispec.WholeDevicesDir, ReadOnly: true})
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-other"}, c)
			requireUnserved(t, code, r)
			require.True(t, n.Logged("container already mounts another view of the PCI sysfs; not stacking ours on it", "default/nri-serve-other"), "serve says so:\n%s", n.Plugin.Log())
		})
		t.Run("bad input", func(t *testing.T) {
			s.routes.expect(t, node, "`cdi-devices.noderesource.dev/container.<name>` naming `"+cdispec.DefaultKind+"=gpu0`", "creation refused, one line")
			pod := s.h.RunPod(t, containerdtest.Pod{Name: "nri-serve-bad", Annotations: map[string]string{
				nriplugin.CDIContainerAnnotation + "gfd": "- " + cdispec.DefaultKind + "=gpu0",
			}})
			_, err := pod.Create(t, s.verifyContainer("gfd"))
			// crictl quotes the plugin's line again.
			require.ErrorContains(t, err, `nvml-mock-sysfs: pod default/nri-serve-bad: annotation cdi-devices.noderesource.dev/container.gfd: \"mock.nvidia.com/pcisysfs=gpu0\": no such device`)
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-after-bad"}, s.verifyContainer("gfd"))
			s.requireAllGreen(t, code, r)
		})
		if programs.Sabotage(t) == "" {
			require.Positive(t, n.Metric(t, `nvml_mock_sysfs_nri_containers_total{result="served"}`))
		}
	})

	t.Run("annotated", func(t *testing.T) {
		const annotated = route + " --nri-inject annotated"
		s.startServeNRI(t, false, "--nri-inject", "annotated")
		t.Run("CDI annotation", func(t *testing.T) {
			s.routes.expect(t, annotated, "`cdi-devices.noderesource.dev/container.<name>` (no device-injector)", "verify passes")
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-cdi", Annotations: map[string]string{
				nriplugin.CDIContainerAnnotation + "gpu-feature-discovery": "- " + device,
			}}, s.verifyContainer("gpu-feature-discovery"))
			s.requireAllGreen(t, code, r)
		})
		t.Run("our annotation", func(t *testing.T) {
			s.routes.expect(t, annotated, "`"+nriplugin.InjectAnnotation+": \"true\"`", "verify passes")
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-ours", Annotations: map[string]string{nriplugin.InjectAnnotation: "true"}}, s.verifyContainer("nfd-worker"))
			s.requireAllGreen(t, code, r)
		})
		t.Run("no annotation", func(t *testing.T) {
			s.routes.expect(t, annotated, "nothing", "verify fails: no links directory mounted")
			s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-unasked"}, "plain")
		})
	})

	t.Run("selected", func(t *testing.T) {
		const selected = route + " --nri-inject selected --nri-namespaces gpu --nri-pod-selector app=gfd"
		s.startServeNRI(t, false, "--nri-inject", "selected", "--nri-namespaces", "gpu", "--nri-pod-selector", "app=gfd")
		t.Run("selected pod", func(t *testing.T) {
			s.routes.expect(t, selected, "nothing; labelled `app=gfd`, in `gpu`", "verify passes")
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-gfd", Namespace: "gpu", Labels: map[string]string{"app": "gfd"}}, s.verifyContainer("gfd"))
			s.requireAllGreen(t, code, r)
		})
		t.Run("another label", func(t *testing.T) {
			s.routes.expect(t, selected, "nothing; labelled `app=other`, in `gpu`", "verify fails: no links directory mounted")
			s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-other-label", Namespace: "gpu", Labels: map[string]string{"app": "other"}}, "other")
		})
	})

	t.Run("the tree not rendered", func(t *testing.T) {
		const unrendered = route + ", the tree not rendered (a fleet node with no profile)"
		n := s.startServeNRI(t, true)
		t.Run("asked", func(t *testing.T) {
			s.routes.expect(t, unrendered, "`cdi-devices.noderesource.dev/container.<name>`", "creation refused, one line; the kubelet retries")
			pod := s.h.RunPod(t, containerdtest.Pod{Name: "nri-serve-early", Annotations: map[string]string{nriplugin.CDIContainerAnnotation + "gfd": "- " + device}})
			_, err := pod.Create(t, s.verifyContainer("gfd"))
			require.ErrorContains(t, err, "nvml-mock-sysfs: pod default/nri-serve-early container gfd asked for the mock sysfs")
			require.ErrorContains(t, err, "holds no complete render")
		})
		t.Run("node-wide", func(t *testing.T) {
			s.routes.expect(t, unrendered, "nothing", "starts without the tree, counted in `/metrics`")
			s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-unrendered"}, "system")
			require.Equal(t, 1, n.Metric(t, `nvml_mock_sysfs_nri_containers_total{result="unrendered"}`))
		})
	})

	t.Run("restarts", func(t *testing.T) {
		const restarts = route + ", restarted"
		t.Run("serve", func(t *testing.T) {
			s.routes.expect(t, restarts, "nothing, created while serve was away", "named in serve's log when it registers again, counted in `/metrics`")
			pod := s.h.RunPod(t, containerdtest.Pod{Name: "nri-serve-away"})
			pod.Start(t, containerdtest.Container{Name: "meanwhile", Image: containerdtest.PauseImage})
			n := s.startServeNRI(t, false)
			require.Equal(t, 1, n.Metric(t, "nvml_mock_sysfs_nri_unserved_containers"), "serve's log:\n%s", n.Plugin.Log())
			require.True(t, n.Logged("container runs without the tree: created while the plugin was away or the tree was not complete; restart it to serve it", "default/nri-serve-away"))
		})
		t.Run("containerd", func(t *testing.T) {
			s.routes.expect(t, restarts, "nothing, created after containerd restarted", "serve registers again by itself; verify passes")
			n := s.startServeNRI(t, false)
			away := s.h.Restart(t)
			again := podtest.Until(t, 30*time.Second, "serve registered again", func() (bool, string) {
				return n.Metric(t, "nvml_mock_sysfs_nri_registrations_total") == 2 && n.Metric(t, "nvml_mock_sysfs_nri_registered") == 1, n.Plugin.Log()
			})
			t.Logf("FIGURES containerd away %s; serve registered again %s after it was back", away.Round(time.Millisecond), again.Round(time.Millisecond))
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nri-serve-after-restart"}, s.verifyContainer("gfd"))
			s.requireAllGreen(t, code, r)
		})
	})

	t.Run("plugin off", func(t *testing.T) {
		s.routes.expect(t, route+" off", "nothing", "verify fails: no links directory mounted")
		s.requireUnservedIn(t, containerdtest.Pod{Name: "nri-serve-off"}, "plain")
	})
}
