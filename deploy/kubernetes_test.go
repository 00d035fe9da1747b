package deploy

import (
	"bufio"
	"errors"
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
	script := strings.Join(c.Args, "\n")
	for key := range m.configMaps[0].Data {
		require.Contains(t, script, "--profile "+path.Join(mounted[cmVolume], key))
	}
	require.Contains(t, script, "--root /var/lib/nvml-mock")
	require.Contains(t, script, "--output "+cdiSpecDir+"/")
	require.Contains(t, c.ReadinessProbe.Exec.Command, "mounts", "ready when the gate opens")
	require.True(t, slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "INTERVAL" }))
}

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
	require.Equal(t, []string{DefaultKind + "=" + DeviceName}, devices)
}
