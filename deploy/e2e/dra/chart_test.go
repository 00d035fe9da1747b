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
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
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
	checkChartVFIO     = "the driver's chart with PassthroughSupport, a VFIO claim"

	// chartWriter is the chart's kubelet plugin pod as our chart's
	// writable mode names it among its writers (values.yaml,
	// nri.writable.writers): serve --writable gives it the writable view.
	chartWriter = "dra-driver-nvidia-gpu-component=kubelet-plugin"
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
	checks := []string{checkChartOptedOut, checkChartServed, checkChartVFIO}
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
	// install installs the chart with the values and extra, and waits
	// until its pod publishes want devices; it returns them, the chart's
	// pods, and what uninstalls the release, which goes with the driver's
	// registration and slices before the next install: each is judged
	// alone.
	install := func(t *testing.T, name string, want int, extra ...string) ([]resourcev1.Device, []corev1.Pod, func()) {
		t.Helper()
		args := append([]string{"install", chartRelease, chart, "--namespace", chartNamespace, "--create-namespace"}, values...)
		out, err := s.c.Run(programs.HelmEnv(home), helm, append(args, extra...)...)
		require.NoError(t, err, "helm install the driver's chart:\n%s", out)
		uninstall := func() {
			if out, err := s.c.Run(programs.HelmEnv(home), helm, "uninstall", chartRelease, "--namespace", chartNamespace, "--wait"); err != nil {
				t.Errorf("helm uninstall the driver's chart: %v\n%s", err, out)
			}
			s.c.Unpublish(t, driverName, slicesTimeout)
		}
		var devices []resourcev1.Device
		s.c.Wait(t, fmt.Sprintf("ResourceSlices with %d devices from the chart's pod", want), podTimeout, func() error {
			list, err := s.c.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: "spec.driver=" + driverName})
			if err != nil {
				return err
			}
			// A plugin that exits (the driver does at its start where
			// it cannot serve the gate it is given) publishes nothing:
			// its restart ends the wait at once.
			if crashed := chartPodRestarted(s.c); crashed != "" {
				t.Fatalf("the chart's pod restarted: %s\nevents:\n%s\nthe plugin's pod:\n%s", crashed, s.c.Events(chartNamespace), chartPodLogs(s.c))
			}
			if devices = devicesOf(list.Items); len(devices) != want {
				return fmt.Errorf("%d devices, want %d\nevents:\n%s\nthe plugin's pod:\n%s", len(devices), want, s.c.Events(chartNamespace), chartPodLogs(s.c))
			}
			kubetest.WriteObject(t, objects, name+"-resourceslices.json", list)
			return nil
		})
		pods, err := s.c.Client.CoreV1().Pods(chartNamespace).List(ctx, metav1.ListOptions{})
		require.NoError(t, err)
		kubetest.WriteObject(t, objects, name+"-pods.json", pods)
		return devices, pods.Items, uninstall
	}

	t.Run(checkChartOptedOut, func(t *testing.T) {
		rows.Expect(t, p.Name, checkChartOptedOut, "a device per GPU NVML lists, none with a pcieRoot")
		devices, _, uninstall := install(t, "opted-out", len(x.gpus), optOut...)
		defer uninstall()
		for _, d := range devices {
			_, ok := d.Attributes[resourcev1.QualifiedName(programs.PCIeRootAttribute)]
			require.False(t, ok, "device %s has a pcieRoot, served nothing", d.Name)
		}
	})
	t.Run(checkChartServed, func(t *testing.T) {
		rows.Expect(t, p.Name, checkChartServed, "a device per GPU NVML lists, each with its root complex as pcieRoot")
		devices, pods, uninstall := install(t, "served", len(x.gpus))
		defer uninstall()
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
	t.Run(checkChartVFIO, func(t *testing.T) {
		rows.Expect(t, p.Name, checkChartVFIO, "serve --writable's view, its pod named a writer: the GPU bound to vfio-pci through the view, the claim's CDI spec naming /dev/vfio/<its group>, nothing stood in beneath /host-root; control: the read-only tree, whose module view has no vfio_pci, and the driver's own error")
		t.Log(chartVFIO(t, s, x, install))
	})
	matrix(t)
}

// chartVFIO installs the driver's chart with PassthroughSupport, which
// mounts the node's / at /host-root, its /lib/modules at /lib/modules, and
// its /sys and /proc Bidirectional, and claims one VFIO device: first on
// the read-only tree (the control: its module view has no vfio_pci, so the
// driver runs chroot /host-root modprobe vfio_pci, which a node of mock
// GPUs cannot), then with serve --writable in the node's namespace, the
// chart's pod one of its writers, as our chart's writable mode runs it.
// What the plugin adds beneath /host-root (the module view, the tree's
// iommu_groups) is all the driver gets there. It returns the row's text.
func chartVFIO(t *testing.T, s *suite, x *subject, install func(*testing.T, string, int, ...string) ([]resourcev1.Device, []corev1.Pod, func())) string {
	overlaytest.RequireFUSE(t)
	// The driver waits for a GPU to be free with the node's fuser, chroot
	// into /host-root: without one it retries for a minute and fails.
	overlaytest.RequireProgram(t, "fuser", "psmisc")
	node := s.c.Nodes[0]
	nodeModules(t, node.Runtime)
	gate := []string{"--set", "featureGates.PassthroughSupport=true"}
	want := 2 * len(x.gpus) // a gpu and a vfio device per GPU
	p := &passthrough{suite: s, gpus: x.gpus, cdiDir: node.ProcPath("/var/run/cdi"), objects: kubetest.ObjectsDir(t, "chart-vfio"), detail: map[string]string{}}

	_, _, uninstall := install(t, "vfio-read-only", want, gate...)
	roPrepared, roMsg := p.claimAndPod(t, "chart-read-only")
	p.releaseClaim(t, "chart-read-only")
	uninstall()
	require.False(t, roPrepared, "the read-only tree prepared a claim")
	require.Contains(t, roMsg, `failed to load module "vfio_pci"`, "the driver's message on the read-only tree")

	s.c.Runtime.StopNRIPlugin(t, x.serving.Plugin)
	dir := t.TempDir()
	p.view = filepath.Join(dir, "view")
	s.c.Runtime.StartServeNRI(t, s.bin, containerdtest.ServeNRIOptions{Root: p.view, Profile: x.File, InNode: true,
		Flags: []string{"--writable", "--writable-tree", filepath.Join(dir, "tree"), "--nri-writable-pods", chartNamespace + ":" + chartWriter}})
	_, _, uninstall = install(t, "vfio-served", want, gate...)
	defer uninstall()
	require.DirExists(t, p.viewPath(vfioModule), "the writable view's module view")
	prepared, msg := p.claimAndPod(t, "chart-served")
	require.True(t, prepared, "the claim must be prepared; the driver: %s", msg)
	bdf, _, _ := p.judgePrepared(t, "chart-served")
	p.releaseClaim(t, "chart-served")
	p.c.Wait(t, bdf+" back on nvidia once the claim is released", vfioTimeout, func() error {
		driver, err := p.driverOf(bdf)
		if err == nil && driver != profilefacts.DriverNVIDIA {
			err = fmt.Errorf("%s is on %q", bdf, driver)
		}
		return err
	})
	return p.detail[stepPrepare] + ", back on nvidia once released; control (the read-only tree): " + cell(roMsg)
}

// chartPodRestarted names a container of the chart's pods that has
// restarted, or is "".
func chartPodRestarted(c *kubetest.Cluster) string {
	pods, err := c.Client.CoreV1().Pods(chartNamespace).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, p := range pods.Items {
		for _, st := range append(p.Status.InitContainerStatuses, p.Status.ContainerStatuses...) {
			if st.RestartCount > 0 {
				return fmt.Sprintf("%s/%s, %d times", p.Name, st.Name, st.RestartCount)
			}
		}
	}
	return ""
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
	// chroot: with PassthroughSupport the plugin runs the node's fuser
	// and modprobe through it, into /host-root.
	for _, name := range []string{"basename", "cat", "chroot", "cp", "date", "env", "find", "head", "ln", "ls", "sed", "sleep"} {
		p, err := exec.LookPath(name)
		require.NoError(t, err, "the chart's scripts run %s", name)
		files = append(files, ociimage.File{Path: "/usr/bin/" + name, Source: p, Mode: 0o755})
	}
	return containerdtest.LinkedImage(t, chartImage+":v"+meta.AppVersion, files, []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"})
}
