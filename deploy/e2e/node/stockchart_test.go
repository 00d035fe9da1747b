package node_test

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
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
)

// GPU Feature Discovery's own Helm chart, as the module proxy's zip of
// its module holds it, installed unedited: values only.
const (
	stockChartPath    = "deployments/helm/nvidia-device-plugin"
	stockRelease      = "nvidia-device-plugin"
	stockNamespace    = "nvidia-device-plugin"
	stockGFDContainer = "gpu-feature-discovery-ctr"
	// labelTimestamp is the label GFD adds unless --no-timestamp, as the
	// chart runs it: only the stock pod's labels carry it here.
	labelTimestamp = "nvidia.com/gfd.timestamp"
	// gfdExitLine is the line GFD v0.17.4 ends a failed start with, the
	// reason after it.
	gfdExitLine = "error creating labeler"
)

// stockGFDValues are the values the chart is installed with: GFD alone
// (no device plugin, which needs a kubelet device-plugin socket and
// /dev/nvidia*; no node-feature-discovery subchart, whose images no
// registry here serves: the suite's nfd-master and nfd-worker stand in).
func stockGFDValues() []string {
	return []string{"--set", "gfd.enabled=true", "--set", "devicePlugin.enabled=false", "--set", "nfd.enabled=false"}
}

// gfdImage is the chart's image, v0.17.4's gpu-feature-discovery built
// from the module proxy, under the name the chart asks the node for.
// Where nvml-mock's NRI plugin serves the pod its NVML (fromNRI), that is
// all; else the NVML the suite's pods load (our stand-in, or nvml-mock's
// where supplied) and the ConfigMap's profile beside it, named by the
// image's environment, since the chart mounts no NVML.
func (s *suite) gfdImage(t *testing.T, fromNRI bool) ociimage.Image {
	t.Helper()
	files := []ociimage.File{{Path: "/usr/bin/gpu-feature-discovery", Source: filepath.Join(s.gfd, "gpu-feature-discovery"), Mode: 0o755}}
	env := []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if !fromNRI {
		const nvmlDir, profileAt = "/usr/lib/nvml-mock", "/etc/nvml-mock/config.yaml"
		files = append(files,
			ociimage.File{Path: nvmlDir + "/" + programs.MockNVML, Source: filepath.Join(s.nvml.Dir, programs.MockNVML), Mode: 0o755},
			ociimage.File{Path: profileAt, Source: s.profileFile(t), Mode: 0o644})
		if s.nvml.StandIn {
			files = append(files, ociimage.File{Path: nvmlDir + "/" + programs.StandInConverter, Source: filepath.Join(s.nvml.Dir, programs.StandInConverter), Mode: 0o755})
		}
		env = append(env, programs.NVMLEnv(nvmlDir, profileAt)...)
	}
	return containerdtest.LinkedImage(t, "nvcr.io/nvidia/k8s-device-plugin:"+programs.GFDVersion, files, env)
}

// profileFile is the ConfigMap's profile in a file of its own.
func (s *suite) profileFile(t *testing.T) string {
	t.Helper()
	profile := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(profile, []byte(s.cm.Data[s.key]), 0o644))
	return profile
}

// startNvmlMockNRI runs nvml-mock's NRI plugin, where it and nvml-mock's
// NVML are supplied, on the node beside ours, node-wide as its chart runs
// it, with an overlay holding its NVML and the ConfigMap's profile where
// it looks for them: it serves every pod NVML's environment, and ours the
// PCI sysfs. Its overlay goes to a path of its own in the container, not
// our overlay's, and it preloads none of its shims (GFD is Go: they are
// for C programs). It reports whether it runs.
func (s *suite) startNvmlMockNRI(t *testing.T) bool {
	t.Helper()
	bin, ok := programs.NeedSupplied(t, programs.NvmlMockNRI)
	if !ok || s.nvml.StandIn {
		return false
	}
	lib, err := os.ReadFile(filepath.Join(s.nvml.Dir, programs.MockNVML))
	require.NoError(t, err)
	overlay := t.TempDir()
	for path, data := range map[string][]byte{
		"driver/usr/lib64/" + programs.MockNVML: lib,
		"driver/config/config.yaml":             []byte(s.cm.Data[s.key]),
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(overlay, filepath.Dir(path)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(overlay, path), data, 0o755))
	}
	s.c.Runtime.StartNRIPlugin(t, "10-nvml-mock", exec.Command(bin,
		"--socket-path", s.c.Runtime.NRISocket, "--plugin-index", "10", "--health-addr", "",
		"--overlay-host-path", overlay, "--overlay-mount-path", "/opt/nvml-mock-nvml",
		"--ld-preload-shims", ""))
	return true
}

// testStockGFD installs GFD's own chart with Helm, values only, and checks
// that its pod, which carries no annotation and no hostPath of ours, labels
// the Node through serve --nri: GFD writes its labels to the node's
// features.d, and nfd-worker's local source publishes them. The control
// is the same chart with one more value, the pod annotation that opts the
// pod out of serve --nri: GFD then exits, as v0.17.4 does without the PCI
// sysfs of NVML's GPUs. A sabotaged run (no tree) installs the control's
// values for both.
func (s *suite) testStockGFD(t *testing.T) {
	ctx := context.Background()
	helm := programs.NeedBinary(t, programs.Helm())
	chart := filepath.Join(moduleDir(t, programs.GFDModule, programs.GFDVersion), stockChartPath)
	want := facts(t, s.key, standaloneLiteral, s.cm.Data[s.key])
	machine, machineSaid := requireMachineLabel(t, want)
	// Where nvml-mock's plugin is supplied, its NVML is GFD's, as on a
	// node with both mocks; else the image carries it.
	nvmlFrom := s.nvml.Name() + " in the image"
	fromNRI := s.startNvmlMockNRI(t)
	if fromNRI {
		nvmlFrom = s.nvml.Name() + " from nvml-mock-nri"
	}
	s.c.Runtime.Import(t, s.gfdImage(t, fromNRI), containerdtest.CRINamespace)
	s.c.MarkGPUNode(t, s.node.Name)
	home := t.TempDir()
	install := func(t *testing.T, extra ...string) {
		t.Helper()
		args := append([]string{"install", stockRelease, chart, "--namespace", stockNamespace, "--create-namespace"}, stockGFDValues()...)
		out, err := s.c.Run(programs.HelmEnv(home), helm, append(args, extra...)...)
		require.NoError(t, err)
		t.Logf("helm install GFD's chart:\n%s", out)
		t.Cleanup(func() {
			if out, err := s.c.Run(programs.HelmEnv(home), helm, "uninstall", stockRelease, "--namespace", stockNamespace, "--wait"); err != nil {
				t.Errorf("helm uninstall GFD's chart: %v\n%s", err, out)
			}
		})
	}
	optOut := []string{"--set-json", `podAnnotations={"` + nriplugin.InjectAnnotation + `":"false"}`}
	features := s.nodePath(filepath.Join(programs.NFDFeaturesDir, "gfd"))

	t.Run("opted out", func(t *testing.T) {
		s.rows.Expect(t, "GFD's own chart (v0.17.4, values only), its pod opted out (`podAnnotations`)", "GFD exits: no PCI vendor for NVML's GPUs; no labels written")
		install(t, optOut...)
		pod := s.stockGFDPod(t)
		// The log of a run that ended: the kubelet restarts the container,
		// so the one read may be a new run's, begun between the status and
		// the read; then the next try reads the ended one's.
		var log string
		s.c.Wait(t, "GFD's container exited, its log read whole", 2*time.Minute, func() error {
			p, err := s.c.Client.CoreV1().Pods(stockNamespace).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, c := range p.Status.ContainerStatuses {
				if c.Name == stockGFDContainer && (c.State.Terminated != nil || c.LastTerminationState.Terminated != nil) {
					b, err := s.c.Client.CoreV1().Pods(stockNamespace).GetLogs(pod, &corev1.PodLogOptions{Container: stockGFDContainer, Previous: c.State.Terminated == nil}).DoRaw(ctx)
					if log = string(b); err == nil && !strings.Contains(log, gfdExitLine) {
						err = fmt.Errorf("the log read has no %q yet:\n%s", gfdExitLine, log)
					}
					return err
				}
			}
			return fmt.Errorf("GFD's container has not exited: %+v", p.Status.ContainerStatuses)
		})
		require.Contains(t, log, "unable to read PCI device vendor id", "GFD's own reason")
		_, err := os.Stat(features)
		require.ErrorIs(t, err, os.ErrNotExist, "GFD wrote labels")
	})

	t.Run("served", func(t *testing.T) {
		s.rows.Expect(t, "GFD's own chart (v0.17.4, values only), its pod asking nothing", fmt.Sprintf("Node `%s=compute`, `%s=%d`, `%s` %s, and `%s`, from GFD's own pod (through nfd-worker's local source; %s)",
			labelMode, labelCount, len(want.GPUs), labelMachine, machineSaid, labelTimestamp, nvmlFrom))
		var values []string
		if s.sabotage == programs.SabotageNoTree {
			values = optOut
		}
		began := time.Now()
		install(t, values...)
		var labels map[string]string
		s.c.Wait(t, "GFD's labels in the node's "+programs.NFDFeaturesDir, 2*time.Minute, func() error {
			data, err := os.ReadFile(features)
			if err != nil {
				return err
			}
			labels, err = programs.ParseGFDLabels(data)
			if err != nil || labels[labelTimestamp] == "" {
				return fmt.Errorf("%q: %v", data, err)
			}
			return nil
		})
		require.Equal(t, "compute", labels[labelMode], "GFD's labels: %v", labels)
		require.Equal(t, fmt.Sprint(len(want.GPUs)), labels[labelCount])
		require.Equal(t, machine, labels[labelMachine])
		worker := s.nfdWorkerPod(t, "nfd-worker-local", true, true)
		s.c.RunPod(t, worker)
		got := s.waitLabels(t, "the stock GFD's labels", wantLabels(map[string]string{
			labelTimestamp: labels[labelTimestamp], labelMode: "compute", labelCount: labels[labelCount], labelMachine: labels[labelMachine],
		}))
		s.figure("GFD's own chart installed -> Node %s=%s from its pod in %s", labelTimestamp, got[labelTimestamp], time.Since(began).Round(time.Millisecond))
	})
	// nfd-worker publishes its NodeFeature again without the local source,
	// as the next steps have it: the stock GFD's labels leave the Node.
	require.NoError(t, os.RemoveAll(filepath.Dir(features)), "the node's features.d, in the node's private /etc")
	s.c.RunPod(t, s.nfdPod(t, "nfd-worker-after-stock", true))
	s.waitLabels(t, "without the stock GFD's labels", func(l map[string]string) error {
		if v, ok := l[labelTimestamp]; ok {
			return fmt.Errorf("%s=%s still", labelTimestamp, v)
		}
		return nil
	})
}

// stockGFDPod is the name of the chart's GFD pod on the suite's node, once
// there is one.
func (s *suite) stockGFDPod(t *testing.T) string {
	t.Helper()
	var name string
	s.c.Wait(t, "GFD's chart's pod", 2*time.Minute, func() error {
		list, err := s.c.Client.CoreV1().Pods(stockNamespace).List(context.Background(), metav1.ListOptions{FieldSelector: "spec.nodeName=" + s.node.Name})
		if err != nil {
			return err
		}
		for _, p := range list.Items {
			if strings.Contains(p.Name, "gpu-feature-discovery") {
				name = p.Name
				return nil
			}
		}
		return fmt.Errorf("no GFD pod on %s yet\nevents:\n%s", s.node.Name, s.c.Events(stockNamespace))
	})
	return name
}
