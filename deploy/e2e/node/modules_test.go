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
// $NODE_MODULE: its link's text and its directory's entries.
const moduleScript = programs.OperandGate + `; echo "gate=$?"
[ -f /sys/module/nvidia/refcnt ]; echo "refcnt=$?"
echo "vendor=$(cat "/sys/module/nvidia/drivers/pci:nvidia/$BDF/vendor" 2>&1)"
echo "node-link=$(readlink "/sys/module/$NODE_MODULE")"
echo "node-entries=$(ls "/sys/module/$NODE_MODULE/" 2>&1 | tr '\n' ' ')"
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
	for _, k := range []string{"gate", "refcnt", "vendor", "node-link", "node-entries"} {
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

	t.Run("opted out", func(t *testing.T) {
		s.rows.Expect(t, "the GPU Operator's operand gate (main, aa22a385) in a pod opted out", "`"+programs.OperandGate+"` fails (the node's `/sys/module` has no `nvidia`: its init container would wait forever), no `refcnt`, no `drivers/pci:nvidia/<bdf>`")
		got := moduleState(t, s.c.RunPod(t, s.modulePod(t, "gate-opted-out", bdf, module, false)))
		require.NotEqual(t, "0", got["gate"], "the gate's condition in a pod not served the module view")
		require.NotEqual(t, "0", got["refcnt"], "/sys/module/nvidia/refcnt in a pod not served the module view")
		require.NotEqual(t, "0x10de", got["vendor"], "/sys/module/nvidia/drivers/pci:nvidia/%s/vendor in a pod not served the module view", bdf)
		s.figure("operand gate, opted out: exit %s, refcnt test exit %s", got["gate"], got["refcnt"])
	})
	t.Run("served", func(t *testing.T) {
		s.rows.Expect(t, "the GPU Operator's operand gate (main, aa22a385) in a pod asking nothing", fmt.Sprintf(
			"`%s` passes; `/sys/module/nvidia/refcnt` exists; `/sys/module/nvidia/drivers/pci:nvidia/<bdf>` is the GPU (vendor 0x10de); the node's own modules listed and readable (by %s)", programs.OperandGate, servedBy))
		got := moduleState(t, s.c.RunPod(t, s.modulePod(t, "gate-served", bdf, module, true)))
		require.Equal(t, "0", got["gate"], "the gate's condition in a served pod")
		require.Equal(t, "0", got["refcnt"], "/sys/module/nvidia/refcnt in a served pod")
		require.Equal(t, "0x10de", got["vendor"], "/sys/module/nvidia/drivers/pci:nvidia/%s/vendor in a served pod", bdf)
		require.NotEmpty(t, got["node-link"], "/sys/module/%s in a served pod: a link into the node's /sys/module", module)
		require.Equal(t, entries, got["node-entries"], "/sys/module/%s's entries in a served pod, against the node's", module)
		s.figure("operand gate, served: exit 0; /sys/module/%s -> %s", module, got["node-link"])
	})
}
