package dra_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
)

// The driver's own chart, installed unedited: values only.
const (
	chartRelease   = "dra-driver-nvidia-gpu"
	chartNamespace = "dra-driver-nvidia-gpu"
	// chartImage is the image the chart names, without its tag (v and
	// the chart's appVersion).
	chartImage = "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu"
	// chartNVMLProfile is where, under the driver root, the profile the
	// mock NVML serves lies, which the plugin's container reads through
	// the chart's own mount of the driver root at /driver-root.
	chartNVMLProfile = "etc/nvml-mock/config.yaml"

	checkChartOptedOut = "the driver's chart, its pod opted out"
	checkChartServed   = "the driver's chart, its pod asking nothing"
)

// TestDRADriverChart installs the NVIDIA DRA driver's own Helm chart
// (supplied: no registry serves it), values only, on a node whose NRI
// plugin is serve --nri, node-wide, as our chart runs it: the chart's
// kubelet plugin pod, which carries no annotation and no hostPath of
// ours, publishes each GPU NVML lists with its root complex as pcieRoot.
// The control is the same chart with one more value, the pod annotation
// that opts the pod out: the same GPUs, none with a pcieRoot. A sabotaged
// run serves a tree serve cannot render, so the served row turns red.
func TestDRADriverChart(t *testing.T) {
	began := time.Now()
	p := programs.SuiteProfiles(t)[0]
	p.Name += " driver's chart"
	var rows docmatrix.Rows
	checks := []string{checkChartOptedOut, checkChartServed}
	matrix := func(t *testing.T) {
		kubetest.AppendMatrix(t, fmt.Sprintf("The NVIDIA DRA driver's own chart on a node served by serve --nri (%s, in %s):\n\n%s", p.Name, time.Since(began).Round(time.Second), rows.Table("profile", "check", "result")))
	}
	supplied := map[string]string{}
	for _, name := range []string{programs.GPUKubeletPlugin, programs.MockNVML, programs.DRADriverChart, programs.DRADriverPrestart} {
		var ok bool
		if supplied[name], ok = programs.NeedSupplied(t, name); !ok {
			for _, c := range checks {
				t.Run(c, func(t *testing.T) {
					rows.Expect(t, p.Name, c, "")
					rows.NotRun(t, programs.NotRun(t.Name(), name))
				})
			}
			matrix(t)
			return
		}
	}
	chart, prestart := supplied[programs.DRADriverChart], supplied[programs.DRADriverPrestart]
	// A worker, not the single node: the chart's pod is not on the host
	// network, and only a worker's pods reach the API server at the
	// kubernetes Service's address, as on a real cluster.
	s := startSuite(t, []programs.SuiteProfile{p}, suiteOptions{workers: 1})
	require.NotNil(t, s, "every program is supplied")
	ctx := context.Background()
	// The chart brings its own DeviceClass of the driver's GPUs, by the
	// name the suite's has.
	require.NoError(t, s.c.Client.ResourceV1().DeviceClasses().Delete(ctx, deviceClass, metav1.DeleteOptions{}))
	x := s.render(t, p)
	profile := filepath.Join(s.driverRoot, chartNVMLProfile)
	require.NoError(t, os.MkdirAll(filepath.Dir(profile), 0o755))
	data, err := os.ReadFile(x.nvml)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(profile, data, 0o644))

	node := s.c.Nodes[0]
	// The chart's plugin mounts the kubelet's plugins directory
	// Bidirectional, as on a real node, whose / systemd makes shared.
	node.ShareMounts(t)
	s.c.MarkGPUNode(t, node.Name)
	s.c.Runtime.Import(t, chartImageOf(t, chart, s.plugin, prestart, filepath.Join(s.driverRoot, "usr/lib64", programs.MockNVML)), containerdtest.CRINamespace)

	helm := programs.NeedBinary(t, programs.Helm())
	home := t.TempDir()
	values := []string{
		"--set", "resources.computeDomains.enabled=false",
		// No device plugin runs beside it: the chart asks to be told so.
		"--set", "gpuResourcesEnabledOverride=true",
		"--set", "nvidiaDriverRoot=" + s.driverRoot,
		"--set", "nvidiaCDIHookPath=" + s.hook,
		"--set", "kubeletPlugin.kubeletRegistrarDirectoryPath=" + filepath.Join(node.KubeletRootDir, "plugins_registry"),
		"--set", "kubeletPlugin.kubeletPluginsDirectoryPath=" + filepath.Join(node.KubeletRootDir, "plugins"),
		"--set-json", `kubeletPlugin.containers.gpus.env=[{"name":"MOCK_NVML_CONFIG","value":"/driver-root/` + chartNVMLProfile + `"}]`,
	}
	optOut := []string{"--set-json", `kubeletPlugin.podAnnotations={"` + nriplugin.InjectAnnotation + `":"false"}`}
	objects := kubetest.ObjectsDir(t, kubetest.Slug(p.Name))
	install := func(t *testing.T, name string, extra ...string) ([]resourcev1.Device, []corev1.Pod) {
		t.Helper()
		args := append([]string{"install", chartRelease, chart, "--namespace", chartNamespace, "--create-namespace"}, values...)
		out, err := s.c.Run(programs.HelmEnv(home), helm, append(args, extra...)...)
		require.NoError(t, err, "helm install the driver's chart:\n%s", out)
		// Each install is judged alone: the release and the driver's
		// registration and slices go before the next.
		defer func() {
			if out, err := s.c.Run(programs.HelmEnv(home), helm, "uninstall", chartRelease, "--namespace", chartNamespace, "--wait"); err != nil {
				t.Errorf("helm uninstall the driver's chart: %v\n%s", err, out)
			}
			s.c.Unpublish(t, driverName, slicesTimeout)
		}()
		var devices []resourcev1.Device
		s.c.Wait(t, fmt.Sprintf("ResourceSlices with %d GPUs from the chart's pod", len(x.gpus)), podTimeout, func() error {
			list, err := s.c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
			if err != nil {
				return err
			}
			if devices = devicesOf(list.Items); len(devices) != len(x.gpus) {
				return fmt.Errorf("%d devices, want %d\nevents:\n%s\nthe plugin's pod:\n%s", len(devices), len(x.gpus), s.c.Events(chartNamespace), chartPodLogs(s.c))
			}
			kubetest.WriteObject(t, objects, name+"-resourceslices.json", list)
			return nil
		})
		pods, err := s.c.Client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		kubetest.WriteObject(t, objects, name+"-pods.json", pods)
		return devices, pods.Items
	}

	t.Run(checkChartOptedOut, func(t *testing.T) {
		rows.Expect(t, p.Name, checkChartOptedOut, "a device per GPU NVML lists, none with a pcieRoot")
		devices, _ := install(t, "opted-out", optOut...)
		for _, d := range devices {
			_, ok := d.Attributes[resourcev1.QualifiedName(programs.PCIeRootAttribute)]
			require.False(t, ok, "device %s has a pcieRoot, served nothing", d.Name)
		}
	})
	t.Run(checkChartServed, func(t *testing.T) {
		rows.Expect(t, p.Name, checkChartServed, "a device per GPU NVML lists, each with its root complex as pcieRoot")
		devices, pods := install(t, "served")
		// Installed with the chart's values alone, its pods ask nothing of
		// ours: no annotation, no hostPath of our overlay.
		for _, pod := range pods {
			for k, v := range pod.Annotations {
				require.False(t, strings.Contains(k, "nvml-mock") || strings.HasPrefix(k, "cdi-devices."), "pod %s asks: %s=%s", pod.Name, k, v)
			}
			for _, v := range pod.Spec.Volumes {
				if v.HostPath != nil {
					require.False(t, strings.HasPrefix(v.HostPath.Path, x.servedByNRI), "pod %s mounts our overlay: %s", pod.Name, v.HostPath.Path)
				}
			}
		}
		var r row
		judgeSlices(t, x, devices, s.driverNUMA, &r)
		t.Logf("the chart's pod published %s", strings.Join(r.perGPU, ", "))
	})
	matrix(t)
}

// chartPodLogs are the last lines of each container of the chart's pods,
// for a failure's message.
func chartPodLogs(c *kubetest.Cluster) string {
	ctx := context.Background()
	pods, err := c.Client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, p := range pods.Items {
		for _, ctr := range append(p.Spec.InitContainers, p.Spec.Containers...) {
			logs, err := c.Client.CoreV1().Pods(chartNamespace).GetLogs(p.Name, &corev1.PodLogOptions{Container: ctr.Name, TailLines: ptr.To[int64](15)}).DoRaw(ctx)
			fmt.Fprintf(&b, "%s/%s (%v):\n%s\n", p.Name, ctr.Name, err, logs)
		}
	}
	return b.String()
}

// chartImageOf is the image the driver's chart names, of the supplied
// kubelet plugin and init script, with bash and the commands the chart's
// scripts run, the libraries they link, and the mock NVML's (which the
// init script preloads into the driver root's nvidia-smi).
func chartImageOf(t *testing.T, chart, plugin, prestart, mockNVML string) ociimage.Image {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chart, "Chart.yaml"))
	require.NoError(t, err)
	var meta struct {
		AppVersion string `yaml:"appVersion"`
	}
	require.NoError(t, yaml.Unmarshal(data, &meta), "%s/Chart.yaml", chart)
	require.NotEmpty(t, meta.AppVersion, "%s/Chart.yaml: appVersion", chart)
	files := []ociimage.File{
		{Path: "/usr/bin/gpu-kubelet-plugin", Source: plugin, Mode: 0o755},
		{Path: "/usr/bin/kubelet-plugin-prestart.sh", Source: prestart, Mode: 0o755},
		{Path: "/usr/lib/nvml-mock/" + programs.MockNVML, Source: mockNVML, Mode: 0o755},
	}
	bash, err := exec.LookPath("bash")
	require.NoError(t, err)
	files = append(files, ociimage.File{Path: "/bin/bash", Source: bash, Mode: 0o755}, ociimage.File{Path: "/bin/sh", Source: bash, Mode: 0o755})
	for _, name := range []string{"basename", "cat", "cp", "date", "env", "find", "head", "ln", "ls", "sed", "sleep"} {
		p, err := exec.LookPath(name)
		require.NoError(t, err, "the chart's scripts run %s", name)
		files = append(files, ociimage.File{Path: "/usr/bin/" + name, Source: p, Mode: 0o755})
	}
	return containerdtest.LinkedImage(t, chartImage+":v"+meta.AppVersion, files, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
}
