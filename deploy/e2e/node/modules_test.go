package node_test

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// moduleScript runs, in a pod, the gate's condition and what the
// Operator's other programs test of the module view, one key=value line
// each: the gate's exit status; the startup probe's, driver manager's and
// validator's test that /sys/module/nvidia/refcnt exists (its status);
// the vendor of $BDF through nvidia-container-toolkit's
// /sys/module/nvidia/drivers/pci:nvidia/<bdf>; and the node module
// $NODE_MODULE: its link's text and its directory's entries; then what
// the /proc hook serves: v26.7.1's gate on /proc/modules (its status, or
// that the kernel has no /proc/modules), the first line of
// /proc/driver/nvidia/version, and /proc/devices' NVIDIA lines.
const moduleScript = programs.OperandGate + `; echo "gate=$?"
[ -f /sys/module/nvidia/refcnt ]; echo "refcnt=$?"
echo "vendor=$(cat "/sys/module/nvidia/drivers/pci:nvidia/$BDF/vendor" 2>&1)"
echo "node-link=$(readlink "/sys/module/$NODE_MODULE")"
echo "node-entries=$(ls "/sys/module/$NODE_MODULE/" 2>&1 | tr '\n' ' ')"
if [ ! -e /proc/modules ]; then echo "gate-v2671=no /proc/modules"; else ` + programs.OperandGateV2671 + `; echo "gate-v2671=$?"; fi
echo "proc-version=$(head -n 1 /proc/driver/nvidia/version 2>&1)"
echo "proc-devices=$(grep ' nvidia' /proc/devices | tr '\n' ',')"
`

// moduleState is what moduleScript printed, by key.
func moduleState(t *testing.T, log string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, line := range strings.Split(log, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	for _, k := range []string{"gate", "refcnt", "vendor", "node-link", "node-entries", "gate-v2671", "proc-version", "proc-devices"} {
		require.Contains(t, out, k, "the module pod's log:\n%s", log)
	}
	return out
}

// nodeModule is a module of the node that is none of the view's, and its
// directory's entries as the node lists them: the view must keep it
// listed and readable.
func nodeModule(t *testing.T) (string, string) {
	t.Helper()
	var ours []string
	for _, m := range plan.KernelModules() {
		ours = append(ours, m.Name)
	}
	host, err := os.ReadDir("/sys/module")
	require.NoError(t, err, "the node's modules")
	for _, e := range host {
		if slices.Contains(ours, e.Name()) {
			continue
		}
		entries, err := os.ReadDir("/sys/module/" + e.Name())
		require.NoError(t, err)
		var names []string
		for _, n := range entries {
			names = append(names, n.Name())
		}
		return e.Name(), strings.Join(names, " ")
	}
	t.Fatal("the node has no module of its own under /sys/module")
	return "", ""
}

// modulePod runs moduleScript, served (by serve --nri, asking nothing, as
// a sabotaged run has it: serve) or opted out, with the host's /usr for
// sh, grep and ls.
func (s *suite) modulePod(t *testing.T, name, bdf, module string, served bool) *corev1.Pod {
	t.Helper()
	volumes, mounts := kubetest.HostPathVolumes("usr", []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}})
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ds.Namespace},
		Spec: corev1.PodSpec{
			NodeName:      s.node.Name,
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{
				Name: "toolkit-validation", Image: containerdtest.ConsumerImage, ImagePullPolicy: corev1.PullNever,
				Command:      []string{"sh", "-c", moduleScript},
				Env:          []corev1.EnvVar{{Name: "BDF", Value: bdf}, {Name: "NODE_MODULE", Value: module}, {Name: "LC_ALL", Value: "C"}},
				VolumeMounts: mounts,
			}},
			Volumes: volumes,
		},
	}
	if served {
		s.serve(t, pod, "toolkit-validation")
	} else {
		optOut(pod)
	}
	return pod
}

// testOperandGate runs the GPU Operator's operand gate in a pod opted out
// of serve --nri (the control: the node's /sys/module has no nvidia, so
// the gate would wait forever) and in one asking nothing, which the
// plugin serves the module view: the gate passes, nvidia's refcnt exists,
// its drivers/pci:nvidia/<bdf> leads to the GPU, and a node module stays
// listed and readable.
func (s *suite) testOperandGate(t *testing.T) {
	want := facts(t, s.key, standaloneLiteral, s.cm.Data[s.key])
	require.NotEmpty(t, want.GPUs)
	bdf := want.GPUs[0].BusID
	module, entries := nodeModule(t)
	// One pod each, opted out and served, whose output every row reads.
	states := map[bool]map[string]string{}
	state := func(t *testing.T, served bool) map[string]string {
		t.Helper()
		if got, ok := states[served]; ok {
			return got
		}
		name := map[bool]string{false: "gate-opted-out", true: "gate-served"}[served]
		states[served] = moduleState(t, s.c.RunPod(t, s.modulePod(t, name, bdf, module, served)))
		return states[served]
	}

	t.Run("opted out", func(t *testing.T) {
		s.rows.Expect(t, "the GPU Operator's operand gate (main, aa22a385) in a pod opted out", "`"+programs.OperandGate+"` fails (the node's `/sys/module` has no `nvidia`: its init container would wait forever), no `refcnt`, no `drivers/pci:nvidia/<bdf>`")
		got := state(t, false)
		require.NotEqual(t, "0", got["gate"], "the gate's condition in a pod not served the module view")
		require.NotEqual(t, "0", got["refcnt"], "/sys/module/nvidia/refcnt in a pod not served the module view")
		require.NotEqual(t, "0x10de", got["vendor"], "/sys/module/nvidia/drivers/pci:nvidia/%s/vendor in a pod not served the module view", bdf)
		s.figure("operand gate, opted out: exit %s, refcnt test exit %s", got["gate"], got["refcnt"])
	})
	t.Run("served", func(t *testing.T) {
		s.rows.Expect(t, "the GPU Operator's operand gate (main, aa22a385) in a pod asking nothing", fmt.Sprintf(
			"`%s` passes; `/sys/module/nvidia/refcnt` exists; `/sys/module/nvidia/drivers/pci:nvidia/<bdf>` is the GPU (vendor 0x10de); the node's own modules listed and readable (by %s)", programs.OperandGate, servedBy))
		got := state(t, true)
		require.Equal(t, "0", got["gate"], "the gate's condition in a served pod")
		require.Equal(t, "0", got["refcnt"], "/sys/module/nvidia/refcnt in a served pod")
		require.Equal(t, "0x10de", got["vendor"], "/sys/module/nvidia/drivers/pci:nvidia/%s/vendor in a served pod", bdf)
		require.NotEmpty(t, got["node-link"], "/sys/module/%s in a served pod: a link into the node's /sys/module", module)
		require.Equal(t, entries, got["node-entries"], "/sys/module/%s's entries in a served pod, against the node's", module)
		s.figure("operand gate, served: exit 0; /sys/module/%s -> %s", module, got["node-link"])
	})
	// v26.7.1's gate reads /proc/modules, which only the chart's /proc
	// hook serves (procHook.enabled, its default).
	for _, served := range []bool{false, true} {
		t.Run(map[bool]string{false: "v26.7.1 opted out", true: "v26.7.1 served"}[served], func(t *testing.T) {
			if served {
				s.rows.Expect(t, "the GPU Operator's v26.7.1 operand gate in a pod asking nothing", "`"+programs.OperandGateV2671+"` passes (by the chart's /proc hook)")
			} else {
				s.rows.Expect(t, "the GPU Operator's v26.7.1 operand gate in a pod opted out", "`"+programs.OperandGateV2671+"` fails (the node's `/proc/modules` has no `nvidia`)")
			}
			got := state(t, served)["gate-v2671"]
			if got == "no /proc/modules" {
				s.rows.NotRun(t, programs.NotRunPrefix+"this kernel has no /proc/modules (built without modules): nothing to grep, and nothing for the hook to mount over (it skips it)")
				return
			}
			require.Equal(t, served, got == "0", "v26.7.1's gate's status: %s", got)
		})
	}
	t.Run("/proc opted out", func(t *testing.T) {
		s.rows.Expect(t, "`/proc/driver/nvidia/version` and `/proc/devices` in a pod opted out", "the node's: no `/proc/driver/nvidia`, no NVIDIA major")
		got := state(t, false)
		require.NotContains(t, got["proc-version"], "NVRM", "/proc/driver/nvidia/version in a pod opted out")
		require.Empty(t, got["proc-devices"], "/proc/devices' NVIDIA lines in a pod opted out")
	})
	t.Run("/proc served", func(t *testing.T) {
		s.rows.Expect(t, "`/proc/driver/nvidia/version` and `/proc/devices` in a pod asking nothing", "`NVRM version: NVIDIA UNIX …` with the profile's driver version; `195 nvidia`, `195 nvidiactl` and the dynamic majors beside the node's (by the chart's /proc hook)")
		got := state(t, true)
		require.True(t, strings.HasPrefix(got["proc-version"], "NVRM version: NVIDIA UNIX "), "/proc/driver/nvidia/version in a served pod: %q", got["proc-version"])
		require.Contains(t, got["proc-version"], want.DriverVersion, "/proc/driver/nvidia/version in a served pod: the profile's driver version")
		devices := strings.Split(strings.TrimSuffix(got["proc-devices"], ","), ",")
		require.Subset(t, devices, []string{"195 nvidia", "195 nvidiactl"}, "/proc/devices' NVIDIA lines in a served pod")
		s.figure("/proc, served: %s; %s", got["proc-version"], got["proc-devices"])
	})
}
