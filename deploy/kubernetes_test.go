package deploy_test

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/serve"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// cdiSpecDir is the CDI spec directory containerd and podman both read.
const cdiSpecDir = "/var/run/cdi"

func TestManifestsDecodeStrictly(t *testing.T) {
	m := podtest.DecodeManifests(t, "kubernetes")
	require.Len(t, m.Namespaces, 1)
	require.Len(t, m.DaemonSets, 1)
	require.Len(t, m.ConfigMaps, 1)
	require.Len(t, m.Pods, 1)

	// The decode is strict: a misspelt field fails it.
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          volumeMount: []\n")
	require.ErrorContains(t, (&podtest.Manifests{}).Decode(bad), "volumeMount")
}

func TestDaemonSetServesTheNode(t *testing.T) {
	m := podtest.DecodeManifests(t, "kubernetes")
	ds := m.DaemonSets[0]
	ns := m.Namespaces[0].Name
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
			require.Equal(t, m.ConfigMaps[0].Name, v.ConfigMap.Name)
		}
	}
	require.NotEmpty(t, cmVolume)
	require.Equal(t, ns, m.ConfigMaps[0].Namespace)
	require.Equal(t, []string{"/nvml-mock-sysfs", "serve"}, c.Command)
	flags := argFlags(t, c.Args)
	for key := range m.ConfigMaps[0].Data {
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
	ds := podtest.DecodeManifests(t, "kubernetes").DaemonSets[0]
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
	m := podtest.DecodeManifests(t, "kubernetes")
	data := m.ConfigMaps[0].Data
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
	m := podtest.DecodeManifests(t, "kubernetes")
	pod := m.Pods[0]
	require.Len(t, pod.Spec.Containers, 1)
	key := "cdi-devices.noderesource.dev/container." + pod.Spec.Containers[0].Name
	var devices []string
	require.NoError(t, yaml.UnmarshalStrict([]byte(pod.Annotations[key]), &devices), key)
	require.Equal(t, []string{deploy.DefaultKind + "=" + deploy.DeviceName}, devices)
}
