// Package nriplugin is serve's NRI plugin: registered with the container
// runtime's NRI socket, it gives the containers it serves, as they are
// created, the very edits of serve's CDI device (cdispec.DeviceEdits): the
// overlay, the links directory at /sys/bus/pci/devices, the module view,
// the variables and the hooks; and, beneath a container's own mount of
// the node's / or /sys elsewhere, what cdispec.Beneath decides. A pod needs no device plugin, no annotation and no hostPath of ours, so
// GPU Feature Discovery's or the DRA driver's own chart runs unedited.
//
// Which containers it serves, and which of them get serve --writable's
// writable view rather than the read-only tree, is a Policy, a pure
// function of the pod and the container; the plugin (Plugin) adds what needs the node: whether the
// tree is complete now (its completion marker, read at each creation),
// the mounts the container already has, and the runtime's connection.
package nriplugin

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// Inject says which containers are served without asking.
type Inject string

const (
	// InjectNode serves every container on the node but those of
	// ExcludeNamespaces and of pods that opt out: the default, since a real
	// GPU node's /sys shows its GPUs to every container, and a stock chart
	// (GFD's, the DRA driver's) runs unedited only if nothing has to ask.
	// It is also nvml-mock's own plugin's rule, so one opt-out serves both.
	InjectNode Inject = "node"
	// InjectSelected serves the pods Namespaces and PodSelector name.
	InjectSelected Inject = "selected"
	// InjectAnnotated serves only pods that ask by annotation.
	InjectAnnotated Inject = "annotated"
)

// The annotations the policy reads. A pod asks by the device-injector's
// CDI annotations naming our device (so pods annotated for it keep
// working with no device-injector) or by InjectAnnotation "true"; it opts
// out by InjectAnnotation "false" or by nvml-mock's own opt-out. An ask
// serves the pod in every mode and namespace; an opt-out wins over Inject.
const (
	// CDIContainerAnnotation + a container's name holds a YAML list of CDI
	// device names for that container; CDIPodAnnotation for every one.
	CDIContainerAnnotation = "cdi-devices.noderesource.dev/container."
	CDIPodAnnotation       = "cdi-devices.noderesource.dev/pod"
	// InjectAnnotation is ours, for the whole pod: "true" or "false".
	InjectAnnotation = "nvml-mock-sysfs.nvidia.com/inject"
	// WritableAnnotation is ours too, for the whole pod: "true" asks for
	// the writable view (serve --writable), and so for the tree; "false"
	// keeps the pod to the read-only tree even where Writers name it.
	WritableAnnotation = "nvml-mock-sysfs.nvidia.com/writable"
	// NVMLMockInjectAnnotation is nvml-mock's: "false" opts a pod out of
	// its plugin; it opts the pod out of ours too. Other values are
	// nvml-mock's business.
	NVMLMockInjectAnnotation = "nvml-mock.nvidia.com/inject"
)

// Defaults of Policy.
const (
	// DefaultExcludeNamespaces are the cluster's own (comma-separated): a
	// mock never touches the control plane's pods, the CNI's or kube-proxy's.
	DefaultExcludeNamespaces = "kube-system"
	// DefaultOwnPods selects serve's own pods, as the chart and the raw
	// manifest label them: a rolling update must not serve the new pod
	// from the old one.
	DefaultOwnPods = "app.kubernetes.io/name=nvml-mock-sysfs"
)

// Policy says which containers are served. Its zero value is the default:
// node-wide, kube-system excluded, serve's own pods never.
type Policy struct {
	// Inject is the mode (default InjectNode).
	Inject Inject
	// Device is our CDI device's qualified name, as the annotations name
	// it (default mock.nvidia.com/pcisysfs=all).
	Device string
	// ExcludeNamespaces are not served in InjectNode unless they ask;
	// nil is DefaultExcludeNamespaces, an empty slice excludes none.
	ExcludeNamespaces []string
	// Namespaces and PodSelector are InjectSelected's rule: a pod in one of
	// Namespaces (any, if empty) whose labels PodSelector matches (any, if
	// nil). ParsePolicy refuses the mode with neither.
	Namespaces  []string
	PodSelector labels.Selector
	// OwnPods are never served, whatever they ask (nil: DefaultOwnPods).
	// Check refuses a selector that matches every pod.
	OwnPods labels.Selector
	// Writers are the pods given the writable view without an
	// annotation (the DRA driver's kubelet plugin, a passthrough writer):
	// each is served, in every mode, unless it opts out. Every other
	// served container gets the read-only tree, but for those that ask
	// for writes (WritableAnnotation) or name our CDI device, whose edits
	// are the writable ones in the writable mode.
	Writers []Writer
}

// Writer names pods given the writable view: a pod in Namespace (any, if
// empty) whose labels Pods matches (any, if nil); not both empty.
type Writer struct {
	Namespace string
	Pods      labels.Selector
}

// ParseWriter reads a writer as serve's --nri-writable-pods takes it,
// [NAMESPACE:]SELECTOR: a label selector (kubectl -l's syntax, which has
// no colon), after the namespace and a colon if one is given. "NS:" is
// every pod of NS; a writer that names neither is refused, since it would
// give every pod on the node the writes the policy keeps from them.
func ParseWriter(s string) (Writer, error) {
	ns, sel, found := strings.Cut(s, ":")
	if !found {
		ns, sel = "", s
	}
	var w Writer
	w.Namespace = strings.TrimSpace(ns)
	if strings.TrimSpace(sel) != "" {
		var err error
		if w.Pods, err = labels.Parse(sel); err != nil {
			return Writer{}, fmt.Errorf("writer %q: %v", s, err)
		}
	}
	if err := w.check(); err != nil {
		return Writer{}, fmt.Errorf("writer %q: %v", s, err)
	}
	return w, nil
}

func (w Writer) check() error {
	if w.Namespace == "" && (w.Pods == nil || w.Pods.Empty()) {
		return errors.New("names no namespace and no labels, so every pod; want [NAMESPACE:]SELECTOR")
	}
	return nil
}

// String is the writer as ParseWriter reads it.
func (w Writer) String() string {
	sel := ""
	if w.Pods != nil {
		sel = w.Pods.String()
	}
	if w.Namespace == "" {
		return sel
	}
	return w.Namespace + ":" + sel
}

func (w Writer) matches(pod *api.PodSandbox) bool {
	return (w.Namespace == "" || w.Namespace == pod.GetNamespace()) &&
		(w.Pods == nil || w.Pods.Matches(labels.Set(pod.GetLabels())))
}

// Check refuses a policy that cannot be what its author meant: an own-pods
// selector that matches every pod (an empty one), which would serve none
// and say nothing, and a writer that names every pod.
func (p Policy) Check() error {
	if p.OwnPods != nil && p.OwnPods.Empty() {
		return fmt.Errorf("own pods selector %q: matches every pod, so none would be served; give the labels of serve's own pods (default %s)", p.OwnPods.String(), DefaultOwnPods)
	}
	for _, w := range p.Writers {
		if err := w.check(); err != nil {
			return fmt.Errorf("writer %q: %v", w.String(), err)
		}
	}
	return nil
}

// Verdict is what the policy says of one container.
type Verdict struct {
	// Serve: the container gets the edits.
	Serve bool
	// Asked: the pod asked by annotation, so a tree that is not complete
	// refuses the container (the kubelet retries) instead of starting it
	// without the tree.
	Asked bool
	// Writable: the container gets the writable view where serve has one
	// (--writable); else the read-only tree.
	Writable bool
	// Why is the reason, for the log.
	Why string
}

// Decide is the policy's verdict on a container of pod; an error is bad
// input in the pod's annotations (one line naming the pod, the annotation
// and its value), which refuses the container, unless the pod is one the
// policy leaves alone anyway (serve's own, an excluded namespace's): an
// annotation is no reason to refuse a pod the mock never touches.
func (p Policy) Decide(pod *api.PodSandbox, ctr *api.Container) (Verdict, error) {
	own := p.OwnPods
	if own == nil {
		own, _ = labels.Parse(DefaultOwnPods)
	}
	if own.Matches(labels.Set(pod.GetLabels())) {
		return Verdict{Why: "serve's own pod"}, nil
	}
	a, err := p.annotations(pod, ctr.GetName())
	if err != nil {
		if ns := pod.GetNamespace(); p.excluded(ns) {
			return Verdict{Why: "namespace " + ns + " excluded; its annotation not read: " + err.Error()}, nil
		}
		return Verdict{}, err
	}
	w := p.writer(pod)
	v := p.serves(pod, a, w != nil)
	if !v.Serve {
		return v, nil
	}
	switch {
	case a.writable == a.asked && a.asked != "":
		v.Writable = true
	case a.writable != "":
		v.Writable, v.Why = true, v.Why+"; writable: asked by "+a.writable
	case a.readOnly != "":
		v.Why += "; read-only: asked by " + a.readOnly
	case w != nil:
		v.Writable, v.Why = true, v.Why+"; writable: writer "+w.String()
	}
	return v, nil
}

// serves is the verdict on serving the pod at all, its annotations read;
// writer is whether --nri-writable-pods names it.
func (p Policy) serves(pod *api.PodSandbox, a asks, writer bool) Verdict {
	switch {
	case a.asked != "":
		return Verdict{Serve: true, Asked: true, Why: "asked by " + a.asked}
	case a.optOut != "":
		return Verdict{Why: "opted out by " + a.optOut}
	}
	if v := p.byMode(pod); v.Serve || !writer {
		return v
	}
	return Verdict{Serve: true, Why: "a writer"}
}

// byMode is the verdict of Inject on a pod that neither asks nor opts out.
func (p Policy) byMode(pod *api.PodSandbox) Verdict {
	ns := pod.GetNamespace()
	switch p.Inject {
	case InjectNode, "":
		if p.excluded(ns) {
			return Verdict{Why: "namespace " + ns + " excluded"}
		}
		return Verdict{Serve: true, Why: "node-wide"}
	case InjectSelected:
		if len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, ns) {
			return Verdict{Why: "namespace " + ns + " not selected"}
		}
		if p.PodSelector != nil && !p.PodSelector.Matches(labels.Set(pod.GetLabels())) {
			return Verdict{Why: "pod labels not selected"}
		}
		return Verdict{Serve: true, Why: "selected"}
	default:
		return Verdict{Why: "not asked"}
	}
}

// excluded reports whether node-wide injection leaves namespace ns alone.
func (p Policy) excluded(ns string) bool {
	if p.Inject != InjectNode && p.Inject != "" {
		return false
	}
	exclude := p.ExcludeNamespaces
	if exclude == nil {
		exclude = strings.Split(DefaultExcludeNamespaces, ",")
	}
	return slices.Contains(exclude, ns)
}

// writer is the first of Writers that names the pod, or nil.
func (p Policy) writer(pod *api.PodSandbox) *Writer {
	for i, w := range p.Writers {
		if w.matches(pod) {
			return &p.Writers[i]
		}
	}
	return nil
}

// asks are what a pod's annotations say, each the annotation that says it
// (empty if none): asked for the tree, opted out of it, asked for the
// writable view, kept to the read-only tree.
type asks struct {
	asked, optOut, writable, readOnly string
}

// annotations reads the pod's asks and opt-outs. Naming our CDI device is
// an ask for its edits, which are the writable view's in the writable
// mode: the same a runtime's CDI (the device-injector's route) gives.
func (p Policy) annotations(pod *api.PodSandbox, container string) (asks, error) {
	device := p.device()
	kind, _, _ := strings.Cut(device, "=")
	var a asks
	for _, key := range []string{CDIContainerAnnotation + container, CDIPodAnnotation} {
		value, ok := pod.GetAnnotations()[key]
		if !ok {
			continue
		}
		var names []string
		if err := yaml.Unmarshal([]byte(value), &names); err != nil {
			if !strings.Contains(value, kind) {
				continue // another vendor's malformed list: its plugin says so
			}
			return asks{}, fmt.Errorf("pod %s: annotation %s: %q: not a YAML list of CDI device names", podName(pod), key, value)
		}
		for _, n := range names {
			if n == device {
				a.asked, a.writable = key, key
				break
			}
			if k, _, _ := strings.Cut(n, "="); k == kind {
				return asks{}, fmt.Errorf("pod %s: annotation %s: %q: no such device; kind %s has one, %s", podName(pod), key, n, kind, device)
			}
		}
		if a.asked != "" {
			break
		}
	}
	for _, key := range []string{InjectAnnotation, WritableAnnotation} {
		switch v, ok := pod.GetAnnotations()[key]; {
		case !ok:
		case v != "true" && v != "false":
			return asks{}, fmt.Errorf("pod %s: annotation %s: %q: want \"true\" or \"false\"", podName(pod), key, v)
		case a.asked != "":
		case v == "true":
			a.asked = key
		case key == InjectAnnotation:
			a.optOut = key
		}
	}
	switch v := pod.GetAnnotations()[WritableAnnotation]; {
	case v == "true":
		a.writable = WritableAnnotation
	case v == "false":
		a.writable, a.readOnly = "", WritableAnnotation
	}
	if a.asked == "" && a.optOut == "" && pod.GetAnnotations()[NVMLMockInjectAnnotation] == "false" {
		a.optOut = NVMLMockInjectAnnotation
	}
	return a, nil
}

func (p Policy) device() string {
	return cmp.Or(p.Device, cdispec.DefaultKind+"="+cdispec.DeviceName)
}

// podName is namespace/name, as kubectl names a pod.
func podName(pod *api.PodSandbox) string { return pod.GetNamespace() + "/" + pod.GetName() }
