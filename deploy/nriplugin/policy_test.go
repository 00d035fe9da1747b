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
	draPlugin, vfio := map[string]string{"component": "kubelet-plugin"}, map[string]string{"app": "vfio-manager"}
	writers := Policy{Writers: []Writer{mustWriter(t, "dra:component=kubelet-plugin"), mustWriter(t, "app=vfio-manager")}}
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
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + CDIContainerAnnotation + "c"}},
		{"the device-injector's annotation for another container", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIContainerAnnotation + "other": "- mock.nvidia.com/pcisysfs=all\n"}),
			Verdict{Why: "not asked"}},
		{"the device-injector's pod-wide annotation", Policy{Inject: InjectAnnotated},
			pod("default", nil, map[string]string{CDIPodAnnotation: "- nvidia.com/gpu=0\n- mock.nvidia.com/pcisysfs=all\n"}),
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + CDIPodAnnotation}},
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
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + CDIPodAnnotation}},
		// Who gets the writable view: those that ask for writes, name our
		// CDI device (whose edits are the writable ones), or are named
		// writers; every other served container gets the read-only tree.
		{"node-wide: the read-only tree", writers, pod("default", nil, nil), Verdict{Serve: true, Why: "node-wide"}},
		{"asked for the tree: still read-only", writers, pod("default", nil, map[string]string{InjectAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + InjectAnnotation}},
		{"asked for writes", Policy{}, pod("default", nil, map[string]string{WritableAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + WritableAnnotation}},
		{"asked for writes, in an excluded namespace", Policy{}, pod("kube-system", nil, map[string]string{WritableAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + WritableAnnotation}},
		{"asked for the tree and for writes", Policy{Inject: InjectAnnotated}, pod("default", nil, map[string]string{InjectAnnotation: "true", WritableAnnotation: "true"}),
			Verdict{Serve: true, Asked: true, Writable: true, Why: "asked by " + InjectAnnotation + "; writable: asked by " + WritableAnnotation}},
		{"a named writer, node-wide", writers, pod("dra", draPlugin, nil),
			Verdict{Serve: true, Writable: true, Why: "node-wide; writable: writer dra:component=kubelet-plugin"}},
		{"a writer's labels in another namespace", writers, pod("default", draPlugin, nil), Verdict{Serve: true, Why: "node-wide"}},
		{"a writer of any namespace", writers, pod("default", vfio, nil),
			Verdict{Serve: true, Writable: true, Why: "node-wide; writable: writer app=vfio-manager"}},
		{"a named writer is served in every mode", Policy{Inject: InjectAnnotated, Writers: writers.Writers}, pod("dra", draPlugin, nil),
			Verdict{Serve: true, Writable: true, Why: "a writer; writable: writer dra:component=kubelet-plugin"}},
		{"a named writer in an excluded namespace", Policy{Writers: []Writer{{Namespace: "kube-system"}}}, pod("kube-system", nil, nil),
			Verdict{Serve: true, Writable: true, Why: "a writer; writable: writer kube-system:"}},
		{"a named writer that opts out", writers, pod("dra", draPlugin, map[string]string{InjectAnnotation: "false"}),
			Verdict{Why: "opted out by " + InjectAnnotation}},
		{"a named writer kept read-only by its annotation", writers, pod("dra", draPlugin, map[string]string{WritableAnnotation: "false"}),
			Verdict{Serve: true, Why: "node-wide; read-only: asked by " + WritableAnnotation}},
		{"our CDI device, kept read-only by the annotation", Policy{},
			pod("default", nil, map[string]string{CDIPodAnnotation: "- mock.nvidia.com/pcisysfs=all", WritableAnnotation: "false"}),
			Verdict{Serve: true, Asked: true, Why: "asked by " + CDIPodAnnotation + "; read-only: asked by " + WritableAnnotation}},
		{"writable false alone is no opt-out", Policy{}, pod("default", nil, map[string]string{WritableAnnotation: "false"}),
			Verdict{Serve: true, Why: "node-wide; read-only: asked by " + WritableAnnotation}},
		{"serve's own pod never, writer or not", Policy{Writers: []Writer{{Namespace: "nvml-mock"}}},
			pod("nvml-mock", map[string]string{"app.kubernetes.io/name": "nvml-mock-sysfs"}, map[string]string{WritableAnnotation: "true"}),
			Verdict{Why: "serve's own pod"}},
		// An excluded pod's annotations are not read, so not refused.
		{"a bad annotation in an excluded namespace", Policy{}, pod("kube-system", nil, map[string]string{InjectAnnotation: "yes"}),
			Verdict{Why: `namespace kube-system excluded; its annotation not read: pod kube-system/p: annotation nvml-mock-sysfs.nvidia.com/inject: "yes": want "true" or "false"`}},
		{"a bad device name in an excluded namespace", Policy{}, pod("kube-system", nil, map[string]string{CDIPodAnnotation: "- mock.nvidia.com/pcisysfs=gpu0"}),
			Verdict{Why: `namespace kube-system excluded; its annotation not read: pod kube-system/p: annotation cdi-devices.noderesource.dev/pod: "mock.nvidia.com/pcisysfs=gpu0": no such device; kind mock.nvidia.com/pcisysfs has one, mock.nvidia.com/pcisysfs=all`}},
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
		{map[string]string{WritableAnnotation: "rw"},
			`pod default/p: annotation nvml-mock-sysfs.nvidia.com/writable: "rw": want "true" or "false"`},
	} {
		_, err := Policy{}.Decide(pod("default", nil, c.annotations), &api.Container{Name: "c"})
		require.EqualError(t, err, c.want)
		// Outside node-wide injection no namespace is excluded: the same
		// input in kube-system is refused too.
		bad := pod("kube-system", nil, c.annotations)
		_, err = Policy{Inject: InjectAnnotated}.Decide(bad, &api.Container{Name: "c"})
		require.ErrorContains(t, err, "pod kube-system/p: annotation ")
	}
}

func mustWriter(t *testing.T, s string) Writer {
	t.Helper()
	w, err := ParseWriter(s)
	require.NoError(t, err)
	return w
}

// TestParseWriter: --nri-writable-pods' [NAMESPACE:]SELECTOR; one that
// names every pod is refused, as is a bad selector, each in one line
// naming the value.
func TestParseWriter(t *testing.T) {
	for in, want := range map[string]string{
		"dra:component=kubelet-plugin": "dra:component=kubelet-plugin",
		"component=kubelet-plugin":     "component=kubelet-plugin",
		"gpu-operator:":                "gpu-operator:",
		" gpu : app in (a,b)":          "gpu:app in (a,b)",
		"app.kubernetes.io/name=x,c=d": "app.kubernetes.io/name=x,c=d",
	} {
		w, err := ParseWriter(in)
		require.NoError(t, err, in)
		require.Equal(t, want, w.String(), in)
	}
	for in, want := range map[string]string{
		"":          `writer "": names no namespace and no labels, so every pod; want [NAMESPACE:]SELECTOR`,
		":":         `writer ":": names no namespace and no labels, so every pod; want [NAMESPACE:]SELECTOR`,
		"  ":        `writer "  ": names no namespace and no labels, so every pod; want [NAMESPACE:]SELECTOR`,
		"ns:a in (": `writer "ns:a in (": `,
	} {
		_, err := ParseWriter(in)
		require.ErrorContains(t, err, want, in)
		require.NotContains(t, err.Error(), "\n")
	}
}

// TestPolicyCheck: an own-pods selector that matches every pod would
// serve none, silently; a writer that names every pod would give all of
// them writes. Both are refused when the plugin is made.
func TestPolicyCheck(t *testing.T) {
	require.NoError(t, Policy{}.Check())
	own, err := labels.Parse(DefaultOwnPods)
	require.NoError(t, err)
	require.NoError(t, Policy{OwnPods: own}.Check())
	_, err = New(Options{Edits: served(t).Edits, Policy: Policy{OwnPods: labels.Everything()}})
	require.EqualError(t, err, `nri plugin policy: own pods selector "": matches every pod, so none would be served; give the labels of serve's own pods (default app.kubernetes.io/name=nvml-mock-sysfs)`)
	_, err = New(Options{Edits: served(t).Edits, Policy: Policy{Writers: []Writer{{}}}})
	require.EqualError(t, err, `nri plugin policy: writer "": names no namespace and no labels, so every pod; want [NAMESPACE:]SELECTOR`)
}
