package chart

import (
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/endpoints"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
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

func TestManifestsDecodeStrictly(t *testing.T) {
	m := podtest.DecodeManifests(t, "../../kubernetes")
	require.Empty(t, m.Namespaces, "nvml-mock's chart makes the namespace")
	require.Empty(t, m.ConfigMaps, "applying deploy/kubernetes never replaces nvml-mock's profile")
	require.Len(t, m.DaemonSets, 1)
	require.Len(t, m.Pods, 1)
	standalone := podtest.DecodeManifests(t, "../../kubernetes/standalone")
	require.Len(t, standalone.Namespaces, 1)
	require.Len(t, standalone.ConfigMaps, 1)
	require.Empty(t, standalone.DaemonSets, "one DaemonSet serves both ways")

	// The decode is strict: a misspelt field fails it.
	bad := []byte("apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: x\nspec:\n  template:\n    spec:\n      containers:\n        - name: c\n          volumeMount: []\n")
	require.ErrorContains(t, (&podtest.Manifests{}).Decode(bad), "volumeMount")
}

func TestDaemonSetServesTheNode(t *testing.T) {
	m := podtest.DecodeManifests(t, "../../kubernetes")
	standalone := podtest.DecodeManifests(t, "../../kubernetes/standalone")
	ds := m.DaemonSets[0]
	ns := standalone.Namespaces[0].Name
	require.Equal(t, ns, ds.Namespace, "nvml-mock's namespace, where its ConfigMap is")
	require.Equal(t, ns, m.Pods[0].Namespace)
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
	require.Equal(t, nvmlMockConfigMap, standalone.ConfigMaps[0].Name)
	require.Equal(t, ns, standalone.ConfigMaps[0].Namespace)
	require.Contains(t, standalone.ConfigMaps[0].Data, nvmlMockProfileKey)
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
	ds := podtest.DecodeManifests(t, "../../kubernetes").DaemonSets[0]
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
	for path, probe := range map[string]*corev1.Probe{endpoints.HealthzPath: c.LivenessProbe, endpoints.ReadyzPath: c.ReadinessProbe} {
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
	b, err := os.ReadFile("../../kubernetes/Dockerfile")
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
	m := podtest.DecodeManifests(t, "../../kubernetes/standalone")
	data := m.ConfigMaps[0].Data
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
	m := podtest.DecodeManifests(t, "../../kubernetes")
	pod := m.Pods[0]
	require.Len(t, pod.Spec.Containers, 1)
	key := "cdi-devices.noderesource.dev/container." + pod.Spec.Containers[0].Name
	var devices []string
	require.NoError(t, yaml.UnmarshalStrict([]byte(pod.Annotations[key]), &devices), key)
	require.Equal(t, []string{cdispec.DefaultKind + "=" + cdispec.DeviceName}, devices)

	// verify finds NVML's profile where nvml-mock's containers have it.
	c := pod.Spec.Containers[0]
	require.Len(t, c.VolumeMounts, 1)
	require.Equal(t, nvmlMockConfigMap, pod.Spec.Volumes[0].ConfigMap.Name)
	require.Equal(t, c.VolumeMounts[0].Name, pod.Spec.Volumes[0].Name)
	require.Contains(t, c.Env, corev1.EnvVar{Name: "MOCK_NVML_CONFIG", Value: path.Join(c.VolumeMounts[0].MountPath, nvmlMockProfileKey)})
}

// The image is loaded onto the node, never pulled: a node without it says
// so (ErrImageNeverPull) rather than asking a registry. The name has no
// registry, so containerd resolves it under docker.io/library.
func TestDaemonSetImageIsLocal(t *testing.T) {
	c := podtest.DecodeManifests(t, "../../kubernetes").DaemonSets[0].Spec.Template.Spec.Containers[0]
	require.Equal(t, corev1.PullNever, c.ImagePullPolicy)
	require.NotContains(t, c.Image, "/", "a bare name, which containerd resolves as %s", containerdName(c.Image))
}

// containerdName is the full reference containerd resolves a bare image
// name to, the name a kubelet asks it for.
func containerdName(image string) string { return "docker.io/library/" + image }

// TestKindStepsLoadTheManifestsImage checks docs/user/kubernetes.md's kind steps
// against the manifest: docker builds and loads the manifest's name;
// podman, which would name a local build localhost/..., builds under the
// name containerd resolves and loads that through an archive.
func TestKindStepsLoadTheManifestsImage(t *testing.T) {
	image := podtest.DecodeManifests(t, "../../kubernetes").DaemonSets[0].Spec.Template.Spec.Containers[0].Image
	doc, err := os.ReadFile("../../../docs/user/kubernetes.md")
	require.NoError(t, err)
	steps := map[string][]string{} // the command's first words -> its other words
	for _, line := range strings.Split(string(doc), "\n") {
		f := strings.Fields(line)
		for _, cmd := range []string{"docker build", "podman build", "podman save", "kind load image-archive", "kind load docker-image"} {
			n := len(strings.Fields(cmd))
			if len(f) > n && strings.Join(f[:n], " ") == cmd {
				require.NotContains(t, steps, cmd, "docs/user/kubernetes.md has one %q step", cmd)
				steps[cmd] = f[n:]
			}
		}
	}
	tag := func(cmd string) string {
		i := slices.Index(steps[cmd], "-t")
		require.True(t, i >= 0 && i+1 < len(steps[cmd]), "docs/user/kubernetes.md: %s names its image with -t: %q", cmd, steps[cmd])
		return steps[cmd][i+1]
	}
	require.Equal(t, image, tag("docker build"))
	require.Equal(t, containerdName(image), tag("podman build"), "podman's local build would be localhost/%s, which the kubelet looks for in a registry", image)
	require.Equal(t, []string{"-o", "nvml-mock-sysfs.tar", containerdName(image)}, steps["podman save"])
	require.Equal(t, []string{"nvml-mock-sysfs.tar"}, steps["kind load image-archive"])
	require.Equal(t, []string{image}, steps["kind load docker-image"])
}

// TestDocsSayHowLongAConfigMapUpdateTakes: a changed ConfigMap reached the
// pod 44 to 90 s after the API update on a real node, not "within about a
// minute", and the manifest and the docs say so.
func TestDocsSayHowLongAConfigMapUpdateTakes(t *testing.T) {
	for _, name := range []string{"../../../README.md", "../../../docs/user/kubernetes.md", "../../kubernetes/nvml-mock-sysfs.yaml", "../../serve/serve.go"} {
		b, err := os.ReadFile(name)
		require.NoError(t, err)
		text := strings.Join(strings.Fields(string(b)), " ")
		text = strings.ReplaceAll(text, " # ", " ")
		text = strings.ReplaceAll(text, " // ", " ")
		require.False(t, strings.Contains(text, "about a minute"), "%s says a ConfigMap change arrives in about a minute", name)
		if name != "../../../README.md" {
			require.True(t, strings.Contains(text, "44 to 90 s"), "%s does not say how long it took (44 to 90 s)", name)
		}
	}
	require.GreaterOrEqual(t, podtest.ConfigMapUpdateWait, 2*time.Minute, "tests on a real kubelet wait longer than the 90 s seen")
}

// TestReadmeKubernetesQuickStart checks the README's Kubernetes quick
// start against the manifests, line by line: the image it builds and loads
// is the DaemonSet's, it applies the files that hold the ConfigMap and the
// DaemonSet (in that order, the namespace first), every file a line names
// exists, it waits on that DaemonSet in its namespace, it reads the labels
// the node suite judges, and the annotation it shows names our device.
// The node suite (deploy/e2e/node) applies the files these lines name,
// in their order, as kubectl apply --server-side does, and checks the
// README's sample labels against its Node.
func TestReadmeKubernetesQuickStart(t *testing.T) {
	steps := overlaytest.ReadmeShell(t)["Kubernetes quick start"]
	ds := podtest.DecodeManifests(t, "../../kubernetes/nri").DaemonSets[0]
	image := ds.Spec.Template.Spec.Containers[0].Image
	require.Equal(t, []string{
		"make build",
		"docker build -t " + image + " -f deploy/kubernetes/Dockerfile .",
		"kind load docker-image " + image,
		"kubectl apply --server-side -f deploy/kubernetes/standalone/nvml-mock-config.yaml",
		"helm install " + ds.Name + " deploy/helm/nvml-mock-sysfs -n " + ds.Namespace + " --set nri.enabled=true",
		"kubectl -n " + ds.Namespace + " rollout status daemonset/" + ds.Name + " --timeout=2m",
		"kubectl get nodes -L nvidia.com/gpu.mode -L nvidia.com/gpu.count -L nvidia.com/gpu.machine",
		"kubectl get resourceslices -o yaml",
	}, steps)
	files := namedFiles(steps)
	require.Len(t, files, 2, "the Dockerfile and the standalone ConfigMap (TestHelmDocsInstallTheChart renders the install): %q", files)
	require.Empty(t, missingFiles(t, files), "files the README's quick start names")

	// Nothing is added to the workloads' pods: the README says how one
	// opts out instead.
	readme, err := os.ReadFile("../../../README.md")
	require.NoError(t, err)
	require.Contains(t, string(readme), "`"+nriplugin.InjectAnnotation+`: "false"`+"`", "README: the opt-out annotation")
	require.NotContains(t, string(readme), "cdi-devices.noderesource.dev/container.<container-name>", "README: no pod is annotated for our device")
}

// The file check fails on a path that is not there, and reads every
// command's -f, not only kubectl apply's of one form.
func TestReadmeFileCheckFailsOnAWrongPath(t *testing.T) {
	steps := []string{
		"docker build -t x -f deploy/kubernetes/Dockerfile .",
		"kubectl apply --server-side -f deploy/kubernetes/nvml-mock-sysfs.yaml",
		"kubectl apply -f deploy/kubernetes/no-such-manifest.yaml",
		"kubectl create --filename=deploy/kubernetes/standalone/no-such.yaml",
	}
	require.Equal(t, []string{"deploy/kubernetes/Dockerfile", "deploy/kubernetes/nvml-mock-sysfs.yaml", "deploy/kubernetes/no-such-manifest.yaml", "deploy/kubernetes/standalone/no-such.yaml"}, namedFiles(steps))
	require.Equal(t, []string{"deploy/kubernetes/no-such-manifest.yaml", "deploy/kubernetes/standalone/no-such.yaml"}, missingFiles(t, namedFiles(steps)))
}

// namedFiles are the files shell lines name with -f or --filename, as
// written (relative to the repository's top, where the README's commands
// run).
func namedFiles(steps []string) []string {
	var files []string
	for _, step := range steps {
		f := strings.Fields(step)
		for i, w := range f {
			switch {
			case (w == "-f" || w == "--filename") && i+1 < len(f):
				files = append(files, f[i+1])
			case strings.HasPrefix(w, "--filename="):
				files = append(files, strings.TrimPrefix(w, "--filename="))
			}
		}
	}
	return files
}

// missingFiles are those of files that do not exist below the repository.
func missingFiles(t *testing.T, files []string) []string {
	t.Helper()
	var missing []string
	for _, f := range files {
		if _, err := os.Stat(filepath.Join(overlaytest.Repo(t), f)); err != nil {
			missing = append(missing, f)
		}
	}
	return missing
}

// docs/user/kubernetes.md's kind steps apply and wait as the README's quick start
// does (server-side apply, a bounded rollout wait), and every file their
// kubectl lines name exists.
func TestKindStepsApplyAsTheReadmeDoes(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/user/kubernetes.md")
	require.NoError(t, err)
	var readmeWait string
	for _, step := range overlaytest.ReadmeShell(t)["Kubernetes quick start"] {
		if strings.Contains(step, " rollout status ") {
			readmeWait = step
		}
	}
	require.NotEmpty(t, readmeWait)
	var kubectl []string
	for _, line := range strings.Split(string(doc), "\n") {
		line = strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(line, "kubectl apply "):
			require.True(t, strings.HasPrefix(line, "kubectl apply --server-side -f "), "docs/user/kubernetes.md: %q: apply as the README does", line)
		case strings.Contains(line, " rollout status "):
			require.Equal(t, readmeWait, line, "docs/user/kubernetes.md waits as the README does")
		default:
			continue
		}
		kubectl = append(kubectl, line)
	}
	require.GreaterOrEqual(t, len(kubectl), 4, "the standalone ConfigMap, the DaemonSet, its rollout, the verify pod: %q", kubectl)
	require.Empty(t, missingFiles(t, namedFiles(kubectl)), "files docs/user/kubernetes.md's kubectl lines name")
}
