// Package nriplugin is serve's NRI plugin: registered with the container
// runtime's NRI socket, it gives the containers it serves, as they are
// created, the very edits of serve's CDI device (deploy.DeviceEdits): the
// overlay, the links directory at /sys/bus/pci/devices and the variables.
// A pod needs no device plugin, no annotation and no hostPath of ours, so
// GPU Feature Discovery's or the DRA driver's own chart runs unedited.
//
// Which containers it serves is a Policy, a pure function of the pod and
// the container; the plugin (Plugin) adds what needs the node: whether the
// tree is complete now (its completion marker, read at each creation),
// the mounts the container already has, and the runtime's connection.
package nriplugin

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"
	"gopkg.in/yaml.v3"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
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
	OwnPods labels.Selector
}

// Verdict is what the policy says of one container.
type Verdict struct {
	// Serve: the container gets the edits.
	Serve bool
	// Asked: the pod asked by annotation, so a tree that is not complete
	// refuses the container (the kubelet retries) instead of starting it
	// without the tree.
	Asked bool
	// Why is the reason, for the log.
	Why string
}

// Decide is the policy's verdict on a container of pod; an error is bad
// input in the pod's annotations (one line naming the pod, the annotation
// and its value), which refuses the container.
func (p Policy) Decide(pod *api.PodSandbox, ctr *api.Container) (Verdict, error) {
	own := p.OwnPods
	if own == nil {
		own, _ = labels.Parse(DefaultOwnPods)
	}
	if own.Matches(labels.Set(pod.GetLabels())) {
		return Verdict{Why: "serve's own pod"}, nil
	}
	asked, optOut, err := p.annotations(pod, ctr.GetName())
	switch {
	case err != nil:
		return Verdict{}, err
	case asked != "":
		return Verdict{Serve: true, Asked: true, Why: "asked by " + asked}, nil
	case optOut != "":
		return Verdict{Why: "opted out by " + optOut}, nil
	}
	ns := pod.GetNamespace()
	switch p.Inject {
	case InjectNode, "":
		exclude := p.ExcludeNamespaces
		if exclude == nil {
			exclude = strings.Split(DefaultExcludeNamespaces, ",")
		}
		if slices.Contains(exclude, ns) {
			return Verdict{Why: "namespace " + ns + " excluded"}, nil
		}
		return Verdict{Serve: true, Why: "node-wide"}, nil
	case InjectSelected:
		if len(p.Namespaces) > 0 && !slices.Contains(p.Namespaces, ns) {
			return Verdict{Why: "namespace " + ns + " not selected"}, nil
		}
		if p.PodSelector != nil && !p.PodSelector.Matches(labels.Set(pod.GetLabels())) {
			return Verdict{Why: "pod labels not selected"}, nil
		}
		return Verdict{Serve: true, Why: "selected"}, nil
	default:
		return Verdict{Why: "not asked"}, nil
	}
}

// annotations reads the pod's asks and opt-outs: the annotation that
// asks for our device (empty if none), the one that opts out.
func (p Policy) annotations(pod *api.PodSandbox, container string) (asked, optOut string, err error) {
	device := p.device()
	kind, _, _ := strings.Cut(device, "=")
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
			return "", "", fmt.Errorf("pod %s: annotation %s: %q: not a YAML list of CDI device names", podName(pod), key, value)
		}
		for _, n := range names {
			if n == device {
				return key, "", nil
			}
			if k, _, _ := strings.Cut(n, "="); k == kind {
				return "", "", fmt.Errorf("pod %s: annotation %s: %q: no such device; kind %s has one, %s", podName(pod), key, n, kind, device)
			}
		}
	}
	switch v, ok := pod.GetAnnotations()[InjectAnnotation]; {
	case !ok:
	case v == "true":
		return InjectAnnotation, "", nil
	case v == "false":
		return "", InjectAnnotation, nil
	default:
		return "", "", fmt.Errorf("pod %s: annotation %s: %q: want \"true\" or \"false\"", podName(pod), InjectAnnotation, v)
	}
	if pod.GetAnnotations()[NVMLMockInjectAnnotation] == "false" {
		return "", NVMLMockInjectAnnotation, nil
	}
	return "", "", nil
}

func (p Policy) device() string {
	return cmp.Or(p.Device, deploy.DefaultKind+"="+deploy.DeviceName)
}

// podName is namespace/name, as kubectl names a pod.
func podName(pod *api.PodSandbox) string { return pod.GetNamespace() + "/" + pod.GetName() }
