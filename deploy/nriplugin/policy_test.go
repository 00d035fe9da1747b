package nriplugin

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/labels"
)

func pod(ns string, lbls, annotations map[string]string) *api.PodSandbox {
	return &api.PodSandbox{Id: "pod-" + ns, Name: "p", Namespace: ns, Labels: lbls, Annotations: annotations}
}

func TestDecide(t *testing.T) {
	gfd := map[string]string{"app": "gfd"}
	selected := Policy{Inject: InjectSelected, Namespaces: []string{"gpu"}, PodSelector: labels.SelectorFromSet(gfd)}
	for _, c := range []struct {
		name   string
		policy Policy
		pod    *api.PodSandbox
		want   Verdict
	}{
		{"node-wide serves any pod", Policy{}, pod("default", nil, nil), Verdict{Serve: true, Why: "node-wide"}},
		{"kube-system is excluded by default", Policy{}, pod("kube-system", nil, nil), Verdict{Why: "namespace kube-system excluded"}},
		{"an empty exclusion list excludes none", Policy{ExcludeNamespaces: []string{}}, pod("kube-system", nil, nil), Verdict{Serve: true, Why: "node-wide"}},
		{"an ask wins over the exclusion", Policy{}, pod("kube-system", nil, map[string]string{InjectAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + InjectAnnotation}},
		{"our opt-out", Policy{}, pod("default", nil, map[string]string{InjectAnnotation: "false"}), Verdict{Why: "opted out by " + InjectAnnotation}},
		{"nvml-mock's opt-out is ours too", Policy{}, pod("default", nil, map[string]string{NVMLMockInjectAnnotation: "false"}),
			Verdict{Why: "opted out by " + NVMLMockInjectAnnotation}},
		{"nvml-mock's other values are its own", Policy{}, pod("default", nil, map[string]string{NVMLMockInjectAnnotation: "true"}),
			Verdict{Serve: true, Why: "node-wide"}},
		{"serve's own pod, never", Policy{}, pod("nvml-mock", map[string]string{"app.kubernetes.io/name": "nvml-mock-sysfs"}, map[string]string{InjectAnnotation: "true"}),
			Verdict{Why: "serve's own pod"}},
		{"the device-injector's annotation for this container", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIContainerAnnotation + "c": "- mock.nvidia.com/pcisysfs=all\n"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + CDIContainerAnnotation + "c"}},
		{"the device-injector's annotation for another container", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIContainerAnnotation + "other": "- mock.nvidia.com/pcisysfs=all\n"}),
			Verdict{Why: "not asked"}},
		{"the device-injector's pod-wide annotation", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIPodAnnotation: "- nvidia.com/gpu=0\n- mock.nvidia.com/pcisysfs=all\n"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + CDIPodAnnotation}},
		{"another vendor's devices only", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIPodAnnotation: "- nvidia.com/gpu=0\n"}), Verdict{Why: "not asked"}},
		{"another vendor's malformed list is its plugin's to refuse", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIPodAnnotation: "{nvidia.com/gpu"}), Verdict{Why: "not asked"}},
		{"annotated: no ask, not served", Policy{Inject: InjectAnnotated}, pod("default", nil, nil), Verdict{Why: "not asked"}},
		{"selected: namespace and labels", selected, pod("gpu", gfd, nil), Verdict{Serve: true, Why: "selected"}},
		{"selected: another namespace", selected, pod("default", gfd, nil), Verdict{Why: "namespace default not selected"}},
		{"selected: other labels", selected, pod("gpu", nil, nil), Verdict{Why: "pod labels not selected"}},
		{"selected: an ask outside the selection", selected, pod("default", nil, map[string]string{InjectAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + InjectAnnotation}},
		{"another device kind", Policy{Device: "example.com/sysfs=all", Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIPodAnnotation: "- example.com/sysfs=all"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + CDIPodAnnotation}},
	} {
		t.Run(c.name, func(t *testing.T) {
			v, err := c.policy.Decide(c.pod, &api.Container{Name: "c"})
			require.NoError(t, err)
			require.Equal(t, c.want, v)
		})
	}
}

// TestDecideRefusesBadInput: each refusal is one line naming the pod, the
// annotation and the value.
func TestDecideRefusesBadInput(t *testing.T) {
	for _, c := range []struct {
		annotations map[string]string
		want        string
	}{
		{map[string]string{CDIContainerAnnotation + "c": "- mock.nvidia.com/pcisysfs=gpu0"},
			`pod default/p: annotation cdi-devices.noderesource.dev/container.c: "mock.nvidia.com/pcisysfs=gpu0": no such device; kind mock.nvidia.com/pcisysfs has one, mock.nvidia.com/pcisysfs=all`},
		{map[string]string{CDIPodAnnotation: "[mock.nvidia.com/pcisysfs=all"},
			`pod default/p: annotation cdi-devices.noderesource.dev/pod: "[mock.nvidia.com/pcisysfs=all": not a YAML list of CDI device names`},
		{map[string]string{InjectAnnotation: "yes"},
			`pod default/p: annotation nvml-mock-sysfs.nvidia.com/inject: "yes": want "true" or "false"`},
	} {
		_, err := Policy{}.Decide(pod("default", nil, c.annotations), &api.Container{Name: "c"})
		require.EqualError(t, err, c.want)
	}
}
