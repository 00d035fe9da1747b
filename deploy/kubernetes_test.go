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
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// cdiSpecDir is the CDI spec directory containerd and podman both read.
const cdiSpecDir = "/var/run/cdi"

// What nvml-mock's Helm chart (deployments/nvml-mock/helm/nvml-mock) names:
// its ConfigMap <release>-config holds the profile under config.yaml, and
// its DaemonSet mounts it at /etc/nvml-mock. Its setup renders into
// /var/lib/nvml-mock, which its NRI plugin mounts at /opt/nvml-mock.
const (
	nvmlMockConfigMap   = "nvml-mock-config" // release nvml-mock
	nvmlMockProfileKey  = "config.yaml"
	nvmlMockOverlay     = "/var/lib/nvml-mock"
	nvmlMockOverlayInCt = "/opt/nvml-mock"
)

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
	require.Empty(t, m.namespaces, "nvml-mock's chart makes the namespace")
	require.Empty(t, m.configMaps, "applying deploy/kubernetes never replaces nvml-mock's profile")
	require.Len(t, m.daemonSets, 1)
	require.Len(t, m.pods, 1)
	standalone := decodeManifests(t, "kubernetes/standalone")
	require.Len(t, standalone.namespaces, 1)
	require.Len(t, standalone.configMaps, 1)
	require.Empty(t, standalone.daemonSets, "one DaemonSet serves both ways")

	// The decode is strict: a misspelt field fails it.
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          volumeMount: []\n")
	require.ErrorContains(t, (&manifests{}).decode(bad), "volumeMount")
}

func TestDaemonSetServesTheNode(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	standalone := decodeManifests(t, "kubernetes/standalone")
	ds := m.daemonSets[0]
	ns := standalone.namespaces[0].Name
	require.Equal(t, ns, ds.Namespace, "nvml-mock's namespace, where its ConfigMap is")
	require.Equal(t, ns, m.pods[0].Namespace)
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
	const root, containerRoot = "/var/lib/nvml-mock-sysfs", "/opt/nvml-mock-sysfs"
	require.ElementsMatch(t, []string{root, cdiSpecDir}, hostPaths)
	require.NotEqual(t, nvmlMockOverlay, root, "nvml-mock's setup renders render-pci-sysfs's tree there")

	// The profile is nvml-mock's ConfigMap, by name and key; the standalone
	// example stands in for it.
	var cmVolume string
	for name, v := range volumes {
		if v.ConfigMap != nil {
			cmVolume = name
			require.Equal(t, nvmlMockConfigMap, v.ConfigMap.Name)
		}
	}
	require.NotEmpty(t, cmVolume)
	require.Equal(t, nvmlMockConfigMap, standalone.configMaps[0].Name)
	require.Equal(t, ns, standalone.configMaps[0].Namespace)
	require.Contains(t, standalone.configMaps[0].Data, nvmlMockProfileKey)
	require.Equal(t, []string{"/nvml-mock-sysfs", "serve"}, c.Command)
	flags := argFlags(t, c.Args)
	require.Equal(t, []string{path.Join(mounted[cmVolume], nvmlMockProfileKey)}, flags["profile"])
	require.Equal(t, []string{root}, flags["root"])
	require.Equal(t, []string{containerRoot}, flags["container-root"], "nvml-mock's NRI plugin mounts its overlay at %s", nvmlMockOverlayInCt)
	require.Equal(t, []string{"merge"}, flags["host-devices"], "the node's own devices stay listed")
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

// TestStandaloneConfigMapHoldsNVMLMocksH100 checks the stand-in for
// nvml-mock's ConfigMap: it renders, and its GPUs are those nvml-mock's NVML
// reports for its own h100 profile.
func TestStandaloneConfigMapHoldsNVMLMocksH100(t *testing.T) {
	m := decodeManifests(t, "kubernetes/standalone")
	data := m.configMaps[0].Data
	require.Len(t, data, 1)
	p, err := profile.Parse(nvmlMockProfileKey, []byte(data[nvmlMockProfileKey]))
	require.NoError(t, err)
	machine, err := profile.Normalize(nvmlMockProfileKey, p, profile.Options{})
	require.NoError(t, err)
	_, err = plan.New(machine, plan.Options{})
	require.NoError(t, err, "the example renders")

	ours, err := profile.NVMLGPUs(nvmlMockProfileKey, p)
	require.NoError(t, err)
	h100 := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "h100.yaml")
	theirs, err := profile.LoadFile(h100)
	require.NoError(t, err)
	want, err := profile.NVMLGPUs(h100, theirs)
	require.NoError(t, err)
	require.Empty(t, profile.MatchIdentities(profile.Identities(want), "the standalone ConfigMap", profile.Identities(ours)))
}

func TestVerifyPodAsksForTheDevice(t *testing.T) {
	m := decodeManifests(t, "kubernetes")
	pod := m.pods[0]
	require.Len(t, pod.Spec.Containers, 1)
	key := "cdi-devices.noderesource.dev/container." + pod.Spec.Containers[0].Name
	var devices []string
	require.NoError(t, yaml.UnmarshalStrict([]byte(pod.Annotations[key]), &devices), key)
	require.Equal(t, []string{deploy.DefaultKind + "=" + deploy.DeviceName}, devices)

	// verify finds NVML's profile where nvml-mock's containers have it.
	c := pod.Spec.Containers[0]
	require.Len(t, c.VolumeMounts, 1)
	require.Equal(t, nvmlMockConfigMap, pod.Spec.Volumes[0].ConfigMap.Name)
	require.Equal(t, c.VolumeMounts[0].Name, pod.Spec.Volumes[0].Name)
	require.Contains(t, c.Env, corev1.EnvVar{Name: "MOCK_NVML_CONFIG", Value: path.Join(c.VolumeMounts[0].MountPath, nvmlMockProfileKey)})
}
