package deploy_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/serve"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// cdiSpecDir is the CDI spec directory containerd and podman both read.
const cdiSpecDir = "/var/run/cdi"

// manifests holds every object of deploy/kubernetes, decoded strictly into
// its k8s.io/api type: an unknown or misspelt field fails the decode.
type manifests struct {
	namespaces []corev1.Namespace
	daemonSets []appsv1.DaemonSet
	configMaps []corev1.ConfigMap
	pods       []corev1.Pod
}

func decodeManifests(t *testing.T, dir string) *manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	m := &manifests{}
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		r := utilyaml.NewYAMLReader(bufio.NewReader(fh))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err, f)
			if strings.TrimSpace(string(doc)) == "" {
				continue
			}
			require.NoError(t, m.decode(doc), f)
		}
		require.NoError(t, fh.Close())
	}
	return m
}

func (m *manifests) decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Namespace":
		return decodeInto(doc, &m.namespaces)
	case "apps/v1 DaemonSet":
		return decodeInto(doc, &m.daemonSets)
	case "v1 ConfigMap":
		return decodeInto(doc, &m.configMaps)
	case "v1 Pod":
		return decodeInto(doc, &m.pods)
	}
	return errors.New("unexpected object " + tm.APIVersion + " " + tm.Kind)
}

func decodeInto[T any](doc []byte, list *[]T) error {
	var obj T
	if err := yaml.UnmarshalStrict(doc, &obj); err != nil {
		return err
	}
	*list = append(*list, obj)
	return nil
}

func TestManifestsDecodeStrictly(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	require.Len(t, m.namespaces, 1)
	require.Len(t, m.daemonSets, 1)
	require.Len(t, m.configMaps, 1)
	require.Len(t, m.pods, 1)

	// The decode is strict: a misspelt field fails it.
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          volumeMount: []\n")
	require.ErrorContains(t, (&manifests{}).decode(bad), "volumeMount")
}

func TestDaemonSetServesTheNode(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	ds := m.daemonSets[0]
	ns := m.namespaces[0].Name
	require.Equal(t, ns, ds.Namespace)
	require.Equal(t, ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels)

	pod := ds.Spec.Template.Spec
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	mounted := map[string]string{} // volume name -> mount path
	for _, vm := range c.VolumeMounts {
		v, ok := volumes[vm.Name]
		require.True(t, ok, "volume %q is defined", vm.Name)
		require.Empty(t, vm.SubPath, "a subPath mount never sees ConfigMap updates")
		mounted[vm.Name] = vm.MountPath
		if v.HostPath != nil {
			// The spec names host paths; the container writes them at the same place.
			require.Equal(t, v.HostPath.Path, vm.MountPath)
		}
	}
	var hostPaths []string
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	require.ElementsMatch(t, []string{"/var/lib/nvml-mock", cdiSpecDir}, hostPaths)

	// The profile comes from the example ConfigMap, by name and key.
	var cmVolume string
	for name, v := range volumes {
		if v.ConfigMap != nil {
			cmVolume = name
			require.Equal(t, m.configMaps[0].Name, v.ConfigMap.Name)
		}
	}
	require.NotEmpty(t, cmVolume)
	require.Equal(t, ns, m.configMaps[0].Namespace)
	require.Equal(t, []string{"/nvml-mock-sysfs", "serve"}, c.Command)
	flags := argFlags(t, c.Args)
	for key := range m.configMaps[0].Data {
		require.Equal(t, []string{path.Join(mounted[cmVolume], key)}, flags["profile"])
	}
	require.Equal(t, []string{"/var/lib/nvml-mock"}, flags["root"])
	require.Len(t, flags["output"], 1)
	require.Equal(t, cdiSpecDir, path.Dir(flags["output"][0]))
}

// argFlags reads a container's args, each --name=value, as a map of the
// values each name got.
func argFlags(t *testing.T, args []string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, ok && strings.HasPrefix(a, "--"), "arg %q: want --name=value", a)
		out[name] = append(out[name], value)
	}
	return out
}

// shells are programs that would make a container's command a script.
func isShell(arg string) bool {
	return slices.Contains([]string{"sh", "bash", "ash", "dash", "busybox"}, path.Base(arg))
}

// TestDaemonSetRunsServeWithoutAShell checks the properties that make the
// pod a plain daemon: serve is the process, the kubelet probes its health
// endpoints over HTTP, nothing execs a shell, and the container can write
// nothing but its volumes, with no capabilities and no way to gain any.
func TestDaemonSetRunsServeWithoutAShell(t *testing.T) {
	ds := decodeManifests(t, "kubernetes").daemonSets[0]
	pod := ds.Spec.Template.Spec
	require.Empty(t, pod.InitContainers)
	require.Len(t, pod.Containers, 1)
	c := pod.Containers[0]
	for _, arg := range append(slices.Clone(c.Command), c.Args...) {
		require.False(t, isShell(arg), "%q: no shell in the manifest", arg)
		require.NotContains(t, arg, "\n", "%q: a script, not an argument", arg)
	}
	require.Nil(t, c.Lifecycle, "no exec hooks")

	// The probes: httpGet on serve's endpoints, at the port it listens on.
	require.Len(t, c.Ports, 1)
	port := c.Ports[0]
	require.Equal(t, []string{fmt.Sprintf(":%d", port.ContainerPort)}, argFlags(t, c.Args)["listen"])
	for path, probe := range map[string]*corev1.Probe{serve.HealthzPath: c.LivenessProbe, serve.ReadyzPath: c.ReadinessProbe} {
		require.NotNil(t, probe, path)
		require.Nil(t, probe.Exec, "%s: no exec probe", path)
		require.NotNil(t, probe.HTTPGet, path)
		require.Equal(t, path, probe.HTTPGet.Path)
		require.Equal(t, port.Name, probe.HTTPGet.Port.String(), "%s: probes the listening port by name", path)
	}

	sc := c.SecurityContext
	require.NotNil(t, sc)
	require.Equal(t, ptr(true), sc.ReadOnlyRootFilesystem)
	require.Equal(t, ptr(false), sc.AllowPrivilegeEscalation)
	require.True(t, sc.Privileged == nil || !*sc.Privileged)
	require.NotNil(t, sc.Capabilities)
	require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
	require.Empty(t, sc.Capabilities.Add)

	// Negative control: the checks catch a shell and an exec probe.
	require.True(t, isShell("/bin/sh"))
	require.True(t, isShell("busybox"))
	require.False(t, isShell("/nvml-mock-sysfs"))
}

// TestDockerfileIsScratch checks that the image is the static binary alone:
// FROM scratch, one COPY, an exec-form entrypoint, and no RUN (which would
// need a shell in the image).
func TestDockerfileIsScratch(t *testing.T) {
	b, err := os.ReadFile("kubernetes/Dockerfile")
	require.NoError(t, err)
	var instructions []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instructions = append(instructions, line)
	}
	require.Equal(t, []string{
		"FROM scratch",
		"COPY bin/nvml-mock-sysfs /nvml-mock-sysfs",
		`ENTRYPOINT ["/nvml-mock-sysfs"]`,
	}, instructions)
}

func ptr[T any](v T) *T { return &v }

func TestExampleConfigMapHoldsAProfile(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	data := m.configMaps[0].Data
	require.Len(t, data, 1)
	for key, text := range data {
		p, err := profile.Parse(key, []byte(text))
		require.NoError(t, err)
		machine, err := profile.Normalize(key, p, profile.Options{})
		require.NoError(t, err)
		require.NotEmpty(t, machine.GPUs())
		_, err = plan.New(machine, plan.Options{})
		require.NoError(t, err, "the example renders")
	}
}

func TestVerifyPodAsksForTheDevice(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	pod := m.pods[0]
	require.Len(t, pod.Spec.Containers, 1)
	key := "cdi-devices.noderesource.dev/container." + pod.Spec.Containers[0].Name
	var devices []string
	require.NoError(t, yaml.UnmarshalStrict([]byte(pod.Annotations[key]), &devices), key)
	require.Equal(t, []string{deploy.DefaultKind + "=" + deploy.DeviceName}, devices)
}
