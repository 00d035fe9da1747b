package chart

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/publisher"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// The chart, relative to this package, and its example values: helm lint
// and these tests render each.
const (
	chartDir              = "../../helm/nvml-mock-sysfs"
	chartFleetValues      = chartDir + "/ci/fleet-values.yaml"
	chartStandaloneValues = chartDir + "/ci/standalone-values.yaml"
	chartWritableValues   = chartDir + "/ci/writable-values.yaml"
	chartNRIValues        = chartDir + "/ci/nri-values.yaml"
	chartPublisherValues  = chartDir + "/ci/publisher-values.yaml"
)

// helmOnlyLabels are the labels the chart puts on its objects for Helm's
// tools alone; the raw manifests have none of them, and the selector never
// carries them.
func helmOnlyLabels() []string {
	return []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}
}

// helmCLI runs the Helm CLI from the programs' cache, with its own homes
// under a temporary directory.
type helmCLI struct {
	binary string
	env    []string
	// dir is the working directory; empty means this package's.
	dir string
}

func newHelm(t *testing.T) helmCLI {
	t.Helper()
	return helmCLI{binary: programs.NeedBinary(t, programs.Helm()), env: programs.HelmEnv(t.TempDir())}
}

// run runs helm with args, returning what it printed on stdout and, when
// it failed, the error with its stderr.
func (h helmCLI) run(args ...string) (string, error) {
	cmd := exec.Command(h.binary, args...)
	cmd.Env = append(os.Environ(), h.env...)
	cmd.Dir = h.dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.New("helm " + strings.Join(args, " ") + ": " + err.Error() + ": " + strings.TrimSpace(stderr.String()+stdout.String()))
	}
	return stdout.String(), nil
}

// template renders the chart as release nvml-mock-sysfs in the raw
// manifest's namespace, with more helm template flags (values).
func (h helmCLI) template(t *testing.T, flags ...string) *chartObjects {
	t.Helper()
	out, err := h.run(append([]string{"template", "nvml-mock-sysfs", chartDir, "--namespace", rawDaemonSetNamespace(t)}, flags...)...)
	require.NoError(t, err)
	return decodeChart(t, out)
}

// rawDaemonSetNamespace is the namespace of deploy/kubernetes's DaemonSet,
// nvml-mock's, which the chart's release namespace stands for.
func rawDaemonSetNamespace(t *testing.T) string {
	t.Helper()
	return podtest.DecodeManifests(t, "../../kubernetes").DaemonSets[0].Namespace
}

// chartObjects are the objects helm template printed, decoded strictly
// as podtest decodes the raw manifests: a field the API does not know
// fails the test.
type chartObjects struct{ podtest.Manifests }

// decodeChart decodes helm template's output.
func decodeChart(t *testing.T, out string) *chartObjects {
	t.Helper()
	objs := &chartObjects{}
	require.NoError(t, objs.DecodeAll(strings.NewReader(out)))
	return objs
}

// hasRBAC says whether the chart rendered any of its RBAC objects.
func (o *chartObjects) hasRBAC() bool {
	return len(o.ServiceAccounts)+len(o.ClusterRoles)+len(o.ClusterRoleBindings)+len(o.Roles)+len(o.RoleBindings) > 0
}

// TestHelmLint lints the chart as a release would install it, with its
// defaults and with each example values file: no warning and no error.
func TestHelmLint(t *testing.T) {
	h := newHelm(t)
	// The recipe stamps the version, as Helm's release build does.
	version, err := h.run("version", "--template", "{{.Version}}")
	require.NoError(t, err)
	require.Equal(t, programs.HelmVersion, version)
	for _, values := range []string{"", chartFleetValues, chartStandaloneValues, chartWritableValues, chartNRIValues, chartPublisherValues} {
		args := []string{"lint", "--strict", "--quiet", chartDir}
		if values != "" {
			args = append(args, "--values", values)
		}
		out, err := h.run(args...)
		require.NoError(t, err)
		require.NotContains(t, out, "[WARNING]", values)
		require.NotContains(t, out, "[ERROR]", values)
	}
	// Negative control: lint sees what the schema refuses.
	_, err = h.run("lint", "--strict", "--quiet", chartDir, "--set", "hostDevices=all")
	require.ErrorContains(t, err, "hostDevices")
}

// rawProcHook are the values that make the chart's DaemonSet the raw
// manifests': they do not carry the /proc hook, which the chart turns on
// by default (TestHelmProcHook checks what it adds).
var rawProcHook = []string{"--set", "procHook.enabled=false"}

// TestHelmDefaultsRenderTheRawDaemonSet keeps the chart and the raw
// manifests in step: with its default values but the /proc hook's
// (rawProcHook), in nvml-mock's namespace, the chart renders
// deploy/kubernetes/nvml-mock-sysfs.yaml's DaemonSet and nothing else, but
// for the labels Helm's tools read on the DaemonSet's own metadata. The
// selector is compared as rendered.
func TestHelmDefaultsRenderTheRawDaemonSet(t *testing.T) {
	raw := podtest.DecodeManifests(t, "../../kubernetes").DaemonSets[0]
	h := newHelm(t)
	objs := h.template(t, rawProcHook...)
	require.Len(t, objs.DaemonSets, 1)
	require.Empty(t, objs.ConfigMaps, "the profile is nvml-mock's ConfigMap, never the chart's")
	require.Empty(t, objs.Namespaces)
	require.Empty(t, objs.Pods)
	require.False(t, objs.hasRBAC(), "without label rules the pods need no API access")

	chart := objs.DaemonSets[0]
	for _, label := range helmOnlyLabels() {
		require.Contains(t, chart.Labels, label, "the chart labels its objects for Helm's tools")
	}
	// The YAML first, for a diff a reader can follow; then the objects.
	require.Equal(t, marshalYAML(t, raw), marshalYAML(t, withoutHelmLabels(chart)))
	require.Equal(t, raw, withoutHelmLabels(chart))

	// Negative control: a value that changes the DaemonSet fails the
	// comparison.
	changed := h.template(t, append(slices.Clone(rawProcHook), "--set", "listenPort=9090")...).DaemonSets[0]
	require.NotEqual(t, raw, withoutHelmLabels(changed))
	require.NotEqual(t, raw, withoutHelmLabels(h.template(t).DaemonSets[0]), "the chart's default has the hook")
}

// TestHelmWritable: writable.enabled runs serve --writable with what it
// needs (privileged, /dev/fuse, the overlay's mounts propagating to the
// node, the tree in memory) and nothing else changes.
func TestHelmWritable(t *testing.T) {
	h := newHelm(t)
	plain := h.template(t).DaemonSets[0]
	ds := h.template(t, "--values", chartWritableValues).DaemonSets[0]
	c := ds.Spec.Template.Spec.Containers[0]
	// The flags before the /proc hook's, which comes after them.
	plainArgs := plain.Spec.Template.Spec.Containers[0].Args
	hook := slices.IndexFunc(plainArgs, func(a string) bool { return strings.HasPrefix(a, "--proc-hook-binary=") })
	require.NotEqual(t, -1, hook, "the default has the /proc hook's flag")
	require.Equal(t, slices.Insert(slices.Clone(plainArgs), hook, "--writable", "--writable-tree=/run/nvml-mock-sysfs/tree"), c.Args)
	require.True(t, *c.SecurityContext.Privileged)
	require.Equal(t, corev1.MountPropagationBidirectional, *c.VolumeMounts[0].MountPropagation)
	vols := map[string]corev1.Volume{}
	for _, v := range ds.Spec.Template.Spec.Volumes {
		vols[v.Name] = v
	}
	require.Equal(t, corev1.StorageMediumMemory, vols["tree"].EmptyDir.Medium)
	require.Equal(t, "/dev/fuse", vols["fuse"].HostPath.Path)
	require.Equal(t, corev1.HostPathCharDev, *vols["fuse"].HostPath.Type)
	// Negative control: the default DaemonSet is none of that.
	require.Nil(t, plain.Spec.Template.Spec.Containers[0].SecurityContext.Privileged)
	require.NotContains(t, plain.Spec.Template.Spec.Containers[0].Args, "--writable")

	// With nri.enabled, the writable view goes to writable.writers alone
	// (and to pods that ask): by default the DRA driver's kubelet plugin,
	// by either chart's component label.
	writers := func(args []string) []string {
		return slices.DeleteFunc(slices.Clone(args), func(a string) bool { return !strings.HasPrefix(a, "--nri-writable-pods=") })
	}
	nri := h.template(t, "--values", chartWritableValues, "--set", "nri.enabled=true").DaemonSets[0]
	require.Equal(t, []string{"--nri-writable-pods=dra-driver-nvidia-gpu-component=kubelet-plugin", "--nri-writable-pods=nvidia-dra-driver-gpu-component=kubelet-plugin"},
		writers(nri.Spec.Template.Spec.Containers[0].Args))
	named := h.template(t, "--values", chartWritableValues, "--set", "nri.enabled=true",
		"--set", "writable.writers[0].namespace=gpu-operator", "--set", "writable.writers[0].podSelector=app=nvidia-vfio-manager",
		"--set", "writable.writers[1].namespace=passthrough").DaemonSets[0]
	require.Equal(t, []string{"--nri-writable-pods=gpu-operator:app=nvidia-vfio-manager", "--nri-writable-pods=passthrough:"},
		writers(named.Spec.Template.Spec.Containers[0].Args))
	everyPod := filepath.Join(t.TempDir(), "every-pod.yaml")
	require.NoError(t, os.WriteFile(everyPod, []byte("writable:\n  writers:\n    - namespace: \"\"\n      podSelector: \"\"\n"), 0o644))
	_, err := h.run("template", "nvml-mock-sysfs", chartDir, "--values", chartWritableValues, "--set", "nri.enabled=true", "--values", everyPod)
	require.ErrorContains(t, err, "at '/writable/writers/0': 'anyOf' failed", "a writer that names every pod")
	// Without the NRI plugin there is no one to name.
	require.Empty(t, writers(c.Args))
}

// TestHelmNRIRendersTheRawNRIDaemonSet: nri.enabled runs serve --nri with
// the runtime's socket directory mounted, and renders
// deploy/kubernetes/nri's DaemonSet (without the /proc hook, rawProcHook);
// each mode's flags follow its values.
func TestHelmNRIRendersTheRawNRIDaemonSet(t *testing.T) {
	raw := podtest.DecodeManifests(t, "../../kubernetes/nri").DaemonSets[0]
	h := newHelm(t)
	ds := h.template(t, append([]string{"--values", chartNRIValues}, rawProcHook...)...).DaemonSets[0]
	require.Equal(t, marshalYAML(t, raw), marshalYAML(t, withoutHelmLabels(ds)))
	require.Equal(t, raw, withoutHelmLabels(ds))
	plain := h.template(t, rawProcHook...).DaemonSets[0]
	require.Equal(t, append(slices.Clone(plain.Spec.Template.Spec.Containers[0].Args),
		"--nri", "--nri-socket=/var/run/nri/nri.sock", "--nri-index=90", "--nri-inject=node", "--nri-exclude-namespaces=kube-system"),
		ds.Spec.Template.Spec.Containers[0].Args)
	// Serve's own pods are never served: the default --nri-own-pods is the
	// chart's selector.
	require.Equal(t, nriplugin.DefaultOwnPods, metav1LabelSelector(ds.Spec.Selector.MatchLabels))

	selected := h.template(t, "--values", chartNRIValues, "--set", "nri.inject=selected", "--set", "nri.namespaces={gpu,ml}", "--set", "nri.podSelector=app in (gfd)").DaemonSets[0]
	args := selected.Spec.Template.Spec.Containers[0].Args
	require.Contains(t, args, "--nri-inject=selected")
	require.Contains(t, args, "--nri-namespaces=gpu,ml")
	require.Contains(t, args, "--nri-pod-selector=app in (gfd)")
	require.NotContains(t, strings.Join(args, " "), "--nri-exclude-namespaces")
	_, err := h.run("template", "nvml-mock-sysfs", chartDir, "--values", chartNRIValues, "--set", "nri.inject=selected")
	require.ErrorContains(t, err, "values: nri.inject selected needs nri.namespaces, nri.podSelector, or both")
	// Negative control: the default DaemonSet is not a plugin.
	require.NotContains(t, plain.Spec.Template.Spec.Containers[0].Args, "--nri")
	require.NotContains(t, marshalYAML(t, plain), "/var/run/nri")
}

// TestHelmProcHook: procHook.enabled, the default (the hook fails open),
// has serve install its binary in hostPaths.hook, mounted at its node
// path, and pass the flag naming it; procHook.enabled=false has neither,
// and nothing else changes.
func TestHelmProcHook(t *testing.T) {
	h := newHelm(t)
	plain := h.template(t).DaemonSets[0]
	require.Contains(t, plain.Spec.Template.Spec.Containers[0].Args, "--proc-hook-binary=/var/lib/nvml-mock-sysfs-hook/nvml-mock-sysfs", "on by default")
	off := h.template(t, "--set", "procHook.enabled=false").DaemonSets[0]
	ds := h.template(t, "--set", "hostPaths.hook=/opt/hook/").DaemonSets[0]
	c := ds.Spec.Template.Spec.Containers[0]
	require.Equal(t, append(slices.Clone(off.Spec.Template.Spec.Containers[0].Args), "--proc-hook-binary=/opt/hook/nvml-mock-sysfs"), c.Args)
	require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: "hook", MountPath: "/opt/hook/"})
	dirOrCreate := corev1.HostPathDirectoryOrCreate
	require.Contains(t, ds.Spec.Template.Spec.Volumes, corev1.Volume{Name: "hook",
		VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/opt/hook/", Type: &dirOrCreate}}})
	_, err := h.run("template", "nvml-mock-sysfs", chartDir, "--set", "hostPaths.hook=hook")
	require.ErrorContains(t, err, "/hostPaths/hook", "a relative path")
	// Negative control: procHook.enabled=false is none of that.
	require.NotContains(t, strings.Join(off.Spec.Template.Spec.Containers[0].Args, " "), "--proc-hook-binary")
	require.NotContains(t, marshalYAML(t, off), "nvml-mock-sysfs-hook")
	require.NotContains(t, marshalYAML(t, h.template(t, "--set", "procHook.enabled=false", "--set", "hostPaths.hook=/opt/hook/").DaemonSets[0]), "/opt/hook")
}

// metav1LabelSelector is a selector's labels as a selector string.
func metav1LabelSelector(labels map[string]string) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}

func marshalYAML(t *testing.T, obj any) string {
	t.Helper()
	b, err := yaml.Marshal(obj)
	require.NoError(t, err)
	return string(b)
}

// withoutHelmLabels is ds with helmOnlyLabels dropped from its metadata and
// its pods' (not from its selector).
func withoutHelmLabels(ds appsv1.DaemonSet) appsv1.DaemonSet {
	ds.Labels = maps.Clone(ds.Labels)
	ds.Spec.Template.Labels = maps.Clone(ds.Spec.Template.Labels)
	for _, label := range helmOnlyLabels() {
		delete(ds.Labels, label)
		delete(ds.Spec.Template.Labels, label)
	}
	return ds
}

// TestHelmFleet renders the example fleet (two named nodes, a label rule,
// a default, a profile of its own and an nvml-mock release's): the map is
// serve's format, every profile it names is a built-in or a file the pod
// mounts, serve is told its node, and the pods may read Nodes and nothing
// more. Without label rules the chart makes no RBAC object.
func TestHelmFleet(t *testing.T) {
	h := newHelm(t)
	objs := h.template(t, "--values", chartFleetValues)
	require.Len(t, objs.DaemonSets, 1)
	ds := objs.DaemonSets[0]
	pod := ds.Spec.Template.Spec
	c := pod.Containers[0]

	// serve reads the map and is told its node, never a --profile.
	flags := argFlags(t, c.Args)
	require.NotContains(t, flags, "profile")
	require.Equal(t, []string{"$(NODE_NAME)"}, flags["node-name"])
	require.Contains(t, c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
	require.Len(t, flags["fleet"], 1)
	mapFile := flags["fleet"][0]

	// Each ConfigMap volume's mount path -> the keys the pod finds there.
	var values struct {
		Fleet struct {
			NVMLMockReleases []string `json:"nvmlMockReleases"`
		} `json:"fleet"`
	}
	valuesText, err := os.ReadFile(chartFleetValues)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(valuesText, &values))
	require.Len(t, objs.ConfigMaps, 1)
	fleetCM := objs.ConfigMaps[0]
	require.Equal(t, ds.Name+"-fleet", fleetCM.Name)
	require.Equal(t, ds.Namespace, fleetCM.Namespace)
	configMapKeys := map[string][]string{fleetCM.Name: slices.Collect(maps.Keys(fleetCM.Data))}
	for _, release := range values.Fleet.NVMLMockReleases {
		configMapKeys[release+"-config"] = []string{nvmlMockProfileKey} // nvml-mock's chart's
	}
	mounted := mountedConfigMaps(t, pod, configMapKeys)
	require.Contains(t, mounted, path.Dir(mapFile), "--fleet names a file of a mounted ConfigMap")
	require.Contains(t, mounted[path.Dir(mapFile)], path.Base(mapFile))
	require.Len(t, mounted, 1+len(values.Fleet.NVMLMockReleases), "the fleet ConfigMap and each nvml-mock release's")

	// fleet.yaml holds the map's three keys and nothing else, in the
	// format serve parses strictly.
	mapText := fleetCM.Data[path.Base(mapFile)]
	var keys map[string]any
	require.NoError(t, yaml.Unmarshal([]byte(mapText), &keys))
	require.ElementsMatch(t, []string{"nodes", "labels", "default"}, slices.Collect(maps.Keys(keys)))
	m, err := fleet.Parse(mapFile, []byte(mapText))
	require.NoError(t, err)
	require.Len(t, m.Nodes, 2)
	require.Len(t, m.Labels, 1)
	require.NotEmpty(t, m.Default)

	// Every rule's profile is a built-in, or a file the pod has: a key of
	// a ConfigMap mounted where the map's path resolves.
	var choices []fleet.Choice
	for _, node := range slices.Sorted(maps.Keys(m.Nodes)) {
		choices = append(choices, resolve(t, m, node, nil))
	}
	for _, rule := range m.Labels {
		choices = append(choices, resolve(t, m, "a-node-no-name-matches", rule.Match))
	}
	choices = append(choices, resolve(t, m, "a-node-no-name-matches", nil))
	for _, choice := range choices {
		if !choice.Builtin {
			require.Contains(t, mounted[path.Dir(choice.Profile)], path.Base(choice.Profile), "%s: %s is in no mounted ConfigMap", choice.Rule, choice.Profile)
		}
	}

	// The map's own profiles render.
	for key, text := range fleetCM.Data {
		if key == path.Base(mapFile) {
			continue
		}
		p, err := profile.Parse(key, []byte(text))
		require.NoError(t, err)
		machine, err := profile.Normalize(key, p, profile.Options{})
		require.NoError(t, err)
		_, err = plan.New(machine, plan.Options{})
		require.NoError(t, err, "%s renders", key)
	}

	// Label rules read the pod's Node: a ServiceAccount whose ClusterRole
	// gets, lists and watches nodes and nothing else.
	require.Len(t, objs.ServiceAccounts, 1)
	require.Len(t, objs.ClusterRoles, 1)
	require.Len(t, objs.ClusterRoleBindings, 1)
	sa, role, binding := objs.ServiceAccounts[0], objs.ClusterRoles[0], objs.ClusterRoleBindings[0]
	require.Equal(t, sa.Name, pod.ServiceAccountName)
	require.Equal(t, ds.Namespace, sa.Namespace)
	require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}}}, role.Rules)
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name}, binding.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}, binding.Subjects)

	// Without label rules, no API access: the namespace's default
	// ServiceAccount, as in the raw manifest, and no RBAC object.
	noLabels := h.template(t, "--values", chartFleetValues, "--set-json", "fleet.labels=[]")
	require.False(t, noLabels.hasRBAC())
	require.Empty(t, noLabels.DaemonSets[0].Spec.Template.Spec.ServiceAccountName)
	require.Contains(t, argFlags(t, noLabels.DaemonSets[0].Spec.Template.Spec.Containers[0].Args), "fleet")
}

// resolve is the profile m gives a node of that name and labels.
func resolve(t *testing.T, m *fleet.Map, node string, labels map[string]string) fleet.Choice {
	t.Helper()
	choice, err := m.Resolve(node, labels)
	require.NoError(t, err)
	return choice
}

// mountedConfigMaps maps the mount path of each of the pod's ConfigMap
// volumes to the keys that ConfigMap holds (keys: ConfigMap name -> keys),
// checking that each is mounted whole, read-only, as a directory: a
// subPath mount never sees an update.
func mountedConfigMaps(t *testing.T, pod corev1.PodSpec, keys map[string][]string) map[string][]string {
	t.Helper()
	volumes := map[string]*corev1.ConfigMapVolumeSource{}
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			require.Empty(t, v.ConfigMap.Items, "volume %s: every key, so the map's files are all there", v.Name)
			volumes[v.Name] = v.ConfigMap
		}
	}
	mounted := map[string][]string{}
	for _, vm := range pod.Containers[0].VolumeMounts {
		cm, ok := volumes[vm.Name]
		if !ok {
			continue
		}
		require.Empty(t, vm.SubPath, "volume %s: a subPath mount never sees ConfigMap updates", vm.Name)
		require.True(t, vm.ReadOnly, "volume %s", vm.Name)
		require.Contains(t, keys, cm.Name, "volume %s: a ConfigMap of the chart or of an nvml-mock release", vm.Name)
		mounted[vm.MountPath] = keys[cm.Name]
	}
	return mounted
}

// TestHelmStandaloneProfile renders a built-in profile alone: no ConfigMap
// to mount, and none made.
func TestHelmStandaloneProfile(t *testing.T) {
	objs := newHelm(t).template(t, "--values", chartStandaloneValues)
	require.Empty(t, objs.ConfigMaps)
	require.False(t, objs.hasRBAC())
	pod := objs.DaemonSets[0].Spec.Template.Spec
	require.Equal(t, []string{"dgx-a100"}, argFlags(t, pod.Containers[0].Args)["profile"])
	for _, v := range pod.Volumes {
		require.Nil(t, v.ConfigMap, "volume %s: a built-in profile needs no ConfigMap", v.Name)
	}
}

// TestHelmRefusesContradictoryValues: values that would serve something
// other than asked fail the render, naming the value.
func TestHelmRefusesContradictoryValues(t *testing.T) {
	h := newHelm(t)
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"--set", "profile=dgx-a100", "--set", "fleet.default=t4-vm"}, `profile "dgx-a100" and fleet`},
		{[]string{"--set", "fleet.profiles.gb200\\.yaml=x"}, "fleet.profiles or fleet.nvmlMockReleases is set without"},
		{[]string{"--set", "fleet.default=t4-vm", "--set", "fleet.profiles.fleet\\.yaml=x"}, "fleet.profiles.fleet.yaml"},
		{[]string{"--set", "fleet.default=t4-vm", "--set", "fleet.nvmlMockReleases={a,a}"}, "names a release twice"},
		{[]string{"--set-json", `fleet.labels=[{"match":{"a":"b"},"profle":"x"}]`}, "profle"},
		{[]string{"--set", "hostDevices=all"}, "hostDevices"},
		{[]string{"--set", "publisher.enabled=true"}, "publisher.enabled without fleet"},
		{[]string{"--set", "fleet.default=t4-vm", "--set", "publisher.enabled=true", "--set", "publisher.nodes="}, "publisher.nodes"},
	} {
		_, err := h.run(append([]string{"template", "nvml-mock-sysfs", chartDir}, tc.set...)...)
		require.ErrorContains(t, err, tc.want, tc.set)
	}
}

// TestHelmDocsInstallTheChart runs every helm install line of the chart's
// README and docs/user/kubernetes.md as helm template: each renders, and
// every file it names exists.
func TestHelmDocsInstallTheChart(t *testing.T) {
	h := newHelm(t)
	h.dir = overlaytest.Repo(t) // where the docs' commands run
	var lines int
	for _, doc := range []string{"../../../README.md", "../../../docs/user/kubernetes.md", "../../../docs/user/publisher.md", chartDir + "/README.md"} {
		text, err := os.ReadFile(doc)
		require.NoError(t, err)
		for _, line := range strings.Split(string(text), "\n") {
			words := strings.Fields(line)
			if len(words) < 4 || words[0] != "helm" || words[1] != "install" || !strings.HasPrefix(words[3], "deploy/helm/") {
				continue
			}
			lines++
			require.Empty(t, missingFiles(t, append([]string{words[3]}, namedFiles([]string{line})...)), "%s: %q", doc, line)
			args := []string{"template"}
			for _, w := range words[2:] {
				// The docs quote a --set-json value as one shell word.
				unquoted := strings.Trim(w, "'")
				require.Equal(t, strings.Count(w, "'"), len(w)-len(unquoted), "%s: %q: a word quoted whole, without spaces", doc, w)
				args = append(args, unquoted)
			}
			_, err := h.run(args...)
			require.NoError(t, err, "%s: %q", doc, line)
		}
	}
	require.GreaterOrEqual(t, lines, 6, "each doc installs beside nvml-mock, alone, and a fleet")
}

// TestHelmPublisher renders the publisher (publisher.enabled): one
// Deployment running publish for the Nodes publisher.nodes selects, reading
// the chart's own fleet ConfigMap through the API; a ServiceAccount of its
// own that may list and watch nodes, read that ConfigMap alone, and write
// ResourceSlices, with the verbs the controller calls and an admission
// policy that keeps it to its own slices on KWOK's nodes; pods the
// DaemonSet's selector does not take for its own.
// Off by default, the chart renders none of it.
func TestHelmPublisher(t *testing.T) {
	h := newHelm(t)
	require.Empty(t, h.template(t, "--values", chartFleetValues).Deployments, "off by default")
	objs := h.template(t, "--values", chartPublisherValues)
	require.Len(t, objs.Deployments, 1)
	d := objs.Deployments[0]
	pod := d.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	require.Equal(t, []string{"/nvml-mock-sysfs", "publish"}, c.Command)
	flags := argFlags(t, c.Args)

	var values struct {
		Publisher struct {
			Nodes string `json:"nodes"`
		} `json:"publisher"`
	}
	valuesText, err := os.ReadFile(chartPublisherValues)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(valuesText, &values))
	require.Equal(t, []string{values.Publisher.Nodes}, flags["node-selector"])

	// The map it reads is the chart's fleet ConfigMap, in the release's
	// namespace, holding the map under the key publish reads.
	require.Len(t, objs.ConfigMaps, 1)
	cm := objs.ConfigMaps[0]
	require.Equal(t, []string{cm.Namespace + "/" + cm.Name}, flags["fleet-configmap"])
	require.Contains(t, cm.Data, fleet.ConfigMapKey)
	_, err = fleet.Parse(fleet.ConfigMapKey, []byte(cm.Data[fleet.ConfigMapKey]))
	require.NoError(t, err)
	require.Equal(t, cm.Namespace, d.Namespace)

	// Probed at publish's endpoints, on the port it listens on.
	require.Equal(t, endpoints.ReadyzPath, c.ReadinessProbe.HTTPGet.Path)
	require.Equal(t, endpoints.HealthzPath, c.LivenessProbe.HTTPGet.Path)
	require.Len(t, c.Ports, 1)
	require.Equal(t, []string{fmt.Sprintf(":%d", c.Ports[0].ContainerPort)}, flags["listen"])
	require.Equal(t, c.Ports[0].Name, c.ReadinessProbe.HTTPGet.Port.StrVal)

	// Its pods are not the DaemonSet's.
	require.Len(t, objs.DaemonSets, 1)
	dsSelector, err := metav1.LabelSelectorAsSelector(objs.DaemonSets[0].Spec.Selector)
	require.NoError(t, err)
	require.False(t, dsSelector.Matches(labels.Set(d.Spec.Template.Labels)), "the DaemonSet's selector takes the publisher's pods")
	own, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
	require.NoError(t, err)
	require.True(t, own.Matches(labels.Set(d.Spec.Template.Labels)))

	// Its own ServiceAccount: nodes read, the ConfigMap alone read, the
	// slices written; the DaemonSet's account, for its label rules, is
	// another.
	var sa *corev1.ServiceAccount
	for i := range objs.ServiceAccounts {
		if objs.ServiceAccounts[i].Name == pod.ServiceAccountName {
			sa = &objs.ServiceAccounts[i]
		}
	}
	require.NotNil(t, sa, "the pod's ServiceAccount %q is rendered", pod.ServiceAccountName)
	require.NotEqual(t, objs.DaemonSets[0].Spec.Template.Spec.ServiceAccountName, sa.Name)
	subject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}
	var clusterRules []rbacv1.PolicyRule
	for _, b := range objs.ClusterRoleBindings {
		if !slices.Contains(b.Subjects, subject) {
			continue
		}
		for _, r := range objs.ClusterRoles {
			if r.Name == b.RoleRef.Name && b.RoleRef.Kind == "ClusterRole" {
				clusterRules = append(clusterRules, r.Rules...)
			}
		}
	}
	require.Equal(t, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"list", "watch"}},
		{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"list", "watch", "create", "update", "delete"}},
	}, clusterRules)
	requirePublisherPolicy(t, objs, sa)
	require.Len(t, objs.RoleBindings, 1)
	require.Len(t, objs.Roles, 1)
	rb, role := objs.RoleBindings[0], objs.Roles[0]
	require.Equal(t, []rbacv1.Subject{subject}, rb.Subjects)
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}, rb.RoleRef)
	require.Equal(t, cm.Namespace, role.Namespace)
	require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cm.Name}, Verbs: []string{"get", "list", "watch"}}}, role.Rules)
}

// requirePublisherPolicy: the chart's admission policy binds the
// publisher's account alone, every Node its param, and says the mark and
// KWOK's annotation as the publisher names them. That it refuses what it
// must is the wing's TestPublisher's, on a real API server.
func requirePublisherPolicy(t *testing.T, objs *chartObjects, sa *corev1.ServiceAccount) {
	t.Helper()
	require.Len(t, objs.ValidatingAdmissionPolicies, 1)
	require.Len(t, objs.ValidatingAdmissionPolicyBindings, 1)
	p, b := objs.ValidatingAdmissionPolicies[0], objs.ValidatingAdmissionPolicyBindings[0]
	require.Equal(t, p.Name, b.Spec.PolicyName)
	require.Equal(t, []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny}, b.Spec.ValidationActions)
	require.Equal(t, &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "Node"}, p.Spec.ParamKind)
	require.NotNil(t, b.Spec.ParamRef)
	require.Equal(t, &metav1.LabelSelector{}, b.Spec.ParamRef.Selector, "every Node a param")
	require.Equal(t, ptr(admissionregistrationv1.DenyAction), b.Spec.ParamRef.ParameterNotFoundAction)
	require.Equal(t, ptr(admissionregistrationv1.Fail), p.Spec.FailurePolicy)
	require.Equal(t, []admissionregistrationv1.MatchCondition{{Name: "publisher-account",
		Expression: fmt.Sprintf("request.userInfo.username == %q", "system:serviceaccount:"+sa.Namespace+":"+sa.Name)}}, p.Spec.MatchConditions)
	var text strings.Builder
	for _, v := range p.Spec.Variables {
		text.WriteString(v.Expression + "\n")
	}
	for _, v := range p.Spec.Validations {
		text.WriteString(v.Expression + "\n" + v.Message + "\n" + v.MessageExpression + "\n")
	}
	for _, word := range []string{"'" + publisher.OwnLabel + "'", "'" + publisher.OwnValue + "'", "'" + publisher.KWOKNodeAnnotation + "'", "'" + publisher.KWOKNodeValue + "'"} {
		require.Contains(t, text.String(), word)
	}
}

// TestHelmFleetThroughAPI renders fleet.readThroughAPI: serve keeps the
// fleet ConfigMap's keys, read through the API, in a writable in-memory
// directory that --fleet names (no volume of the ConfigMap, which the
// kubelet syncs late), as the pods' ServiceAccount, which may read that
// ConfigMap alone (a Role) beside the label rules' nodes.
func TestHelmFleetThroughAPI(t *testing.T) {
	objs := newHelm(t).template(t, "--values", chartFleetValues, "--set", "fleet.readThroughAPI=true")
	require.Len(t, objs.DaemonSets, 1)
	ds := objs.DaemonSets[0]
	pod := ds.Spec.Template.Spec
	flags := argFlags(t, pod.Containers[0].Args)
	require.Len(t, objs.ConfigMaps, 1)
	cm := objs.ConfigMaps[0]
	require.Equal(t, []string{cm.Namespace + "/" + cm.Name}, flags["fleet-configmap"])
	require.Len(t, flags["fleet"], 1)
	require.Equal(t, fleet.ConfigMapKey, path.Base(flags["fleet"][0]))

	// --fleet's directory is an in-memory emptyDir, writable; the fleet
	// ConfigMap is mounted nowhere.
	var mount *corev1.VolumeMount
	for i, vm := range pod.Containers[0].VolumeMounts {
		if vm.MountPath == path.Dir(flags["fleet"][0]) {
			mount = &pod.Containers[0].VolumeMounts[i]
		}
	}
	require.NotNil(t, mount, "--fleet's directory is mounted")
	require.False(t, mount.ReadOnly)
	for _, v := range pod.Volumes {
		if v.Name == mount.Name {
			require.NotNil(t, v.EmptyDir, "volume %s", v.Name)
			require.Equal(t, corev1.StorageMediumMemory, v.EmptyDir.Medium)
		}
		require.False(t, v.ConfigMap != nil && v.ConfigMap.Name == cm.Name, "volume %s mounts the fleet ConfigMap", v.Name)
	}

	// The pods' account reads the ConfigMap alone.
	require.Len(t, objs.ServiceAccounts, 1)
	sa := objs.ServiceAccounts[0]
	require.Equal(t, sa.Name, pod.ServiceAccountName)
	require.Len(t, objs.Roles, 1)
	require.Len(t, objs.RoleBindings, 1)
	role, rb := objs.Roles[0], objs.RoleBindings[0]
	require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"}, ResourceNames: []string{cm.Name}, Verbs: []string{"get", "list", "watch"}}}, role.Rules)
	require.Equal(t, rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: role.Name}, rb.RoleRef)
	require.Equal(t, []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: sa.Namespace}}, rb.Subjects)

	// Without label rules: the account and the Role, no ClusterRole.
	noLabels := newHelm(t).template(t, "--values", chartFleetValues, "--set", "fleet.readThroughAPI=true", "--set-json", "fleet.labels=[]")
	require.Len(t, noLabels.ServiceAccounts, 1)
	require.Len(t, noLabels.Roles, 1)
	require.Empty(t, noLabels.ClusterRoles)
	require.Equal(t, noLabels.ServiceAccounts[0].Name, noLabels.DaemonSets[0].Spec.Template.Spec.ServiceAccountName)
}
