package containerdtest_test

import (
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/containerdtest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// The profile is the consumer suite's: five H100s over two PCI domains,
// three root complexes, NUMA -1 and 1, two NVSwitches, and what nvml-mock's
// NVML needs, so GFD and the DRA driver read the same machine through the
// mock NVML that the tree shows them.
//
// profileEnv names another profile file to run the suite with instead (a
// held-out one): it is made servable for the mock NVML as the consumer
// suite makes its extra profiles.
const (
	unseenProfile = "../../../testdata/suite-profiles/two-domains.yaml"
	profileEnv    = "NVML_MOCK_SYSFS_RUNTIME_PROFILE"
	// device is our CDI device, as `cdi` writes it by default.
	device = cdispec.DefaultKind + "=" + cdispec.DeviceName
	// verifyImage holds the static binary alone.
	verifyImage = "localhost/nvml-mock-sysfs/verify:test"
	// profileInImage is where containers without the overlay find the
	// profile to expect (a read-only mount).
	profileInImage = "/profile.yaml"
)

// served is what the tests serve: the binary, a rendered overlay, and our
// CDI spec in the harness's CDI directory.
type served struct {
	h       *containerdtest.Harness
	bin     string
	root    string
	spec    string
	profile string // absolute
	// facts are the profile's, read apart from the renderer
	// (profilefacts): what the rows expect.
	facts *profilefacts.Profile
	// containerRoot is where the render puts the overlay in containers,
	// when not the default.
	containerRoot string
	// routes are TestContainerd's rows for docs/evidence/runtime.md.
	routes *routes
}

func (s *served) cli(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(s.bin, args...).CombinedOutput()
	require.NoError(t, err, "nvml-mock-sysfs %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// serve renders the profile file (made servable for the mock NVML) and
// writes our spec into the harness's CDI directory.
func serve(t testing.TB, h *containerdtest.Harness, profileFile string) *served {
	t.Helper()
	s := &served{h: h, bin: hosttest.BuildBinary(t), routes: &routes{}}
	file, err := filepath.Abs(profileFile)
	require.NoError(t, err)
	data, err := os.ReadFile(file)
	require.NoError(t, err, "the profile to serve")
	s.profile, err = programs.ServableProfile(t.TempDir(), filepath.Base(file), file, data)
	require.NoError(t, err)
	s.facts, err = profilefacts.Read(s.profile)
	require.NoError(t, err)
	// The suite's own profile leaves no fact to the renderer; a held-out
	// one (profileEnv) gets no literal.
	require.NoError(t, s.facts.Literal(""))
	s.root = filepath.Join(t.TempDir(), "overlay")
	// As the deploy path renders: the node's own PCI devices stay listed,
	// which verify checks.
	s.cli(t, "render", "--root", s.root, "--profile", s.profile, "--host-devices", "merge")
	// A sabotaged run's spec serves the sabotaged tree, so that the rows
	// served through it turn red and the negative controls stay green.
	var flags []string
	s.root, flags = programs.SabotagedRoot(t, programs.Sabotage(t), s.root)
	s.spec = filepath.Join(h.CDIDir, "nvml-mock-sysfs.yaml")
	s.cli(t, append([]string{"cdi", "--root", s.root, "--output", s.spec, "--also-at", "/host-sys/bus/pci/devices"}, flags...)...)
	h.Import(t, containerdtest.BinaryImage(t, verifyImage, s.bin), containerdtest.CRINamespace, containerdtest.CtrNamespace)
	h.Import(t, containerdtest.ConsumerBaseImage(), containerdtest.CRINamespace)
	return s
}

// report parses verify's JSON report.
func report(t *testing.T, code int, stdout, stderr string) *compat.Report {
	t.Helper()
	var r compat.Report
	require.NoError(t, json.Unmarshal([]byte(stdout), &r), "verify printed no report (exit %d):\n%s\n%s", code, stdout, stderr)
	return &r
}

// requireAllGreen requires a verify that passed with every check ok, and
// the pcieRoot of each GPU as the profile gives it (profilefacts: a GPU
// whose root it does not give is required a row, its value not compared;
// verify's rows of other devices, NVSwitches, are judged by their own ok).
func (s *served) requireAllGreen(t *testing.T, code int, r *compat.Report) {
	t.Helper()
	require.Equal(t, 0, code, "verify failed: %+v", r.Failures())
	require.NotEmpty(t, r.Results, "verify reported no check at %s: OK of nothing passes", r.Sysfs)
	require.True(t, r.OK(), "verify: failed checks %v", r.FailedChecks())
	var roots, want []string
	gpus := map[string]profilefacts.GPU{}
	for _, g := range s.facts.GPUs {
		gpus[g.BusID] = g
		want = append(want, g.BusID+" "+g.Root)
	}
	for _, c := range r.Results {
		require.True(t, c.OK, "%s %s: %s", c.Check, c.Device, c.Detail)
		if g, ok := gpus[c.Device]; ok && c.Check == "deviceattribute.pcieRoot" {
			root := c.Detail
			if g.Root == "" {
				root = ""
			}
			roots = append(roots, c.Device+" "+root)
		}
	}
	slices.Sort(want)
	slices.Sort(roots)
	require.Equal(t, want, roots, "pcieRoot of every GPU")
}

// verifyContainer is a CRI container that runs verify, with the profile
// mounted for the case it gets no overlay.
func (s *served) verifyContainer(name string) containerdtest.Container {
	args := []string{"verify", "--format", "json"}
	if s.containerRoot != "" {
		args = append(args, "--container-root", s.containerRoot)
	}
	return containerdtest.Container{
		Name:   name,
		Image:  verifyImage,
		Args:   args,
		Mounts: []containerdtest.Mount{{HostPath: s.profile, ContainerPath: profileInImage, ReadOnly: true}},
	}
}

// unservedContainer is verifyContainer for a control that gets no overlay:
// verify reads the profile to expect from its mount, where a served one
// reads the overlay's.
func (s *served) unservedContainer(name string) containerdtest.Container {
	c := s.verifyContainer(name)
	c.Args = append(c.Args, "--profile", profileInImage)
	return c
}

// verifyIn runs a verify container in a new pod and returns its report.
func (s *served) verifyIn(t *testing.T, pod containerdtest.Pod, c containerdtest.Container) (int, *compat.Report) {
	t.Helper()
	res := s.h.RunPod(t, pod).Run(t, c)
	return res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr)
}

// TestContainerd serves the overlay through one private containerd, the
// runtime Kubernetes uses, every way a node hands devices to pods: ctr,
// CRI with CDI devices or annotations, a merged spec, and NRI plugins for
// pods that ask for no device.
func TestContainerd(t *testing.T) {
	h := containerdtest.Start(t, containerdtest.Options{})
	s := serve(t, h, cmp.Or(os.Getenv(profileEnv), unseenProfile))
	t.Cleanup(func() { s.routes.writeDocs(t) })

	t.Run("the settings are containerd's", func(t *testing.T) {
		// A key containerd does not know is silently ignored: read them back.
		dump := h.ConfigDump(t)
		for _, line := range []string{
			"restrict_oom_score_adj = true",
			"cdi_spec_dirs = ['" + h.CDIDir + "']",
			"sandbox = '" + containerdtest.PauseImage + "'",
			"[plugins.'io.containerd.nri.v1.nri']\n    disable = false\n    socket_path = '" + h.NRISocket + "'",
		} {
			require.Contains(t, dump, line)
		}
	})

	t.Run("ctr run --device", func(t *testing.T) {
		s.routes.expect(t, "ctr run", "`--device mock.nvidia.com/pcisysfs=all`", "verify passes")
		code, stdout, stderr := h.CtrRun(t, h.CDIDir, []string{"--device", device}, verifyImage, "/nvml-mock-sysfs", "verify", "--format", "json")
		s.requireAllGreen(t, code, report(t, code, stdout, stderr))
	})

	t.Run("ctr run without the device", func(t *testing.T) {
		s.routes.expect(t, "ctr run", "nothing", "verify fails: no links directory mounted")
		code, stdout, stderr := h.CtrRun(t, h.CDIDir, []string{"--mount", "type=bind,src=" + s.profile + ",dst=" + profileInImage + ",options=rbind:ro"},
			verifyImage, "/nvml-mock-sysfs", "verify", "--format", "json", "--profile", profileInImage)
		require.Equal(t, 1, code)
		require.Contains(t, report(t, code, stdout, stderr).FailedChecks(), verify.LinksMount)
	})

	t.Run("CRI", func(t *testing.T) {
		pod := h.RunPod(t, containerdtest.Pod{Name: "cri"})
		t.Run("CDI_devices", func(t *testing.T) {
			s.routes.expect(t, "CRI", "`CDI_devices` (a device plugin's or DRA driver's answer)", "verify passes")
			c := s.verifyContainer("cdi-devices")
			c.CDIDevices = []string{device}
			res := pod.Run(t, c)
			s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))
		})
		t.Run("cdi.k8s.io annotation", func(t *testing.T) {
			s.routes.expect(t, "CRI", "a `cdi.k8s.io/` annotation", "verify passes")
			c := s.verifyContainer("cdi-annotation")
			c.Annotations = map[string]string{"cdi.k8s.io/nvml-mock-sysfs": device}
			res := pod.Run(t, c)
			s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))
		})
		t.Run("plain container fails", func(t *testing.T) {
			s.routes.expect(t, "CRI", "nothing", "verify fails: no links directory, no overlay, no pcieRoot")
			c := s.unservedContainer("plain")
			res := pod.Run(t, c)
			require.Equal(t, 1, res.ExitCode)
			failed := report(t, res.ExitCode, res.Stdout, res.Stderr).FailedChecks()
			require.Contains(t, failed, verify.LinksMount)
			require.Contains(t, failed, verify.OverlayMount)
			require.Contains(t, failed, "deviceattribute.pcieRoot")
		})
	})

	t.Run("CRI container security and stop", func(t *testing.T) {
		testCRIContainer(t, s)
	})

	t.Run("CRI merged spec", func(t *testing.T) {
		s.routes.expect(t, "CRI, nvml-mock's spec merged", "`CDI_devices` `nvidia.com/gpu=all`", "verify fails before `cdi --merge-into` (a whole /sys/devices mounted), passes after")
		testMergedSpec(t, s)
	})

	t.Run("NRI", func(t *testing.T) {
		testNRI(t, s)
	})

	t.Run("consumers in CRI containers", func(t *testing.T) {
		testConsumers(t, s)
	})
}

// newestShape is the repository's profile of nvml-mock's newest shape: a
// Vera Rubin tray, its superchips in PCI domains 0002 and 000a with
// upper-case bus ids below a root bus 80, NVL72 switches off the tray's
// bus, two ConnectX-9 per GPU and a cpu block.
const newestShape = "../../../testdata/profiles/vera-rubin-tray.yaml"

// TestContainerdNewestShape serves newestShape through containerd as a
// pod is served (CRI CDI_devices, and serve --nri for GFD and the DRA
// driver's discovery, with their unserved negative controls), so
// the runtime suite runs nvml-mock's newest shape in every make test, not
// only when profileEnv names it. Its rows are not docs/evidence/runtime.md's.
func TestContainerdNewestShape(t *testing.T) {
	h := containerdtest.Start(t, containerdtest.Options{})
	s := serve(t, h, newestShape)
	t.Run("CRI CDI_devices", func(t *testing.T) {
		pod := h.RunPod(t, containerdtest.Pod{Name: "cri"})
		c := s.verifyContainer("cdi-devices")
		c.CDIDevices = []string{device}
		res := pod.Run(t, c)
		s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))
	})
	t.Run("consumers in CRI containers", func(t *testing.T) {
		testConsumers(t, s)
	})
}

// testMergedSpec serves the drop-in case: a spec in nvml-mock's shape whose
// top-level edits bind-mount a whole mock /sys/devices, before and after
// `cdi --merge-into`, through CRI as a device plugin's workload gets it.
func testMergedSpec(t *testing.T, s *served) {
	const kind = "nvidia.com/gpu"
	wholeDevices := filepath.Join(t.TempDir(), "sys-devices")
	require.NoError(t, os.MkdirAll(filepath.Join(wholeDevices, "system/cpu"), 0o755))
	file := filepath.Join(s.h.CDIDir, "nvidia.yaml")
	t.Cleanup(func() { _ = os.Remove(file) })
	ro := []string{"ro", "nosuid", "nodev", "bind"}
	_, err := cdispec.WriteSpec(file, &specs.Spec{
		Version: "0.5.0",
		Kind:    kind,
		Devices: []specs.Device{{Name: "all", ContainerEdits: specs.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=all"}}}},
		ContainerEdits: specs.ContainerEdits{
			Env: []string{"NVIDIA_CTK_LIBCUDA_DIR=/usr/lib64"},
			Mounts: []*specs.Mount{
				{HostPath: s.profile, ContainerPath: "/etc/nvml-mock/config.yaml", Options: ro},
				{HostPath: wholeDevices, ContainerPath: cdispec.WholeDevicesDir, Options: ro},
			},
		},
	})
	require.NoError(t, err)
	c := s.unservedContainer("merged")
	c.CDIDevices = []string{kind + "=all"}

	code, r := s.verifyIn(t, containerdtest.Pod{Name: "before-merge"}, c)
	require.Equal(t, 1, code, "before the merge")
	require.Contains(t, r.FailedChecks(), verify.KernelDevices, "the whole-devices mount hides the kernel's /sys/devices")

	// Ours are the mount set (cdispec.Mounts, its one home).
	ours, err := cdispec.Mounts(s.root, "", nil)
	require.NoError(t, err)
	require.Contains(t, s.cli(t, "cdi", "--root", s.root, "--merge-into", file), fmt.Sprintf("removed 1 mounts, added %d", len(ours)))
	c.Args = c.Args[:len(c.Args)-2]
	code, r = s.verifyIn(t, containerdtest.Pod{Name: "after-merge"}, c)
	s.requireAllGreen(t, code, r)
}

// testNRI serves pods that ask for no device through NRI plugins: each
// plugin is connected only while its subtest runs.
func testNRI(t *testing.T, s *served) {
	t.Run("serve --nri", func(t *testing.T) {
		testServeNRI(t, s)
	})
	// containerd/nri's device-injector, where supplied, as the one
	// compatibility row: serve --nri serves every route it served. Its
	// control, in the same pod, is a container neither annotation names.
	t.Run("device-injector", func(t *testing.T) {
		_, injector := s.h.StartDeviceInjector(t)
		if !s.routes.expectWith(t, injector, programs.DeviceInjector, "NRI device-injector (compatibility)",
			"`cdi-devices.noderesource.dev/container.<name>`, or `mounts.noderesource.dev/container.<name>` (`mounts --format json`)",
			"verify passes in each container named; fails in one neither names") {
			return
		}
		mounts := s.cli(t, "mounts", "--root", s.root, "--format", "json", "--also-at", "/host-sys/bus/pci/devices")
		pod := s.h.RunPod(t, containerdtest.Pod{Name: "nri-injector", Annotations: map[string]string{
			"cdi-devices.noderesource.dev/container.gpu-feature-discovery": "- " + device,
			"mounts.noderesource.dev/container.nfd-worker":                 mounts,
		}})
		for _, name := range []string{"gpu-feature-discovery", "nfd-worker"} {
			res := pod.Run(t, s.verifyContainer(name))
			s.requireAllGreen(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))
		}
		c := s.unservedContainer("unannotated")
		res := pod.Run(t, c)
		requireUnserved(t, res.ExitCode, report(t, res.ExitCode, res.Stdout, res.Stderr))
	})

	t.Run("nvml-mock-nri", func(t *testing.T) {
		bin, supplied := programs.NeedSupplied(t, programs.NvmlMockNRI)
		if supplied {
			s.startNvmlMockNRI(t, bin)
		}
		// The pod as docs/user/nvml-mock.md has it: MOCK_PCI_ROOT empty (the plugin
		// keeps a container's own value), and MOCK_NVML_CONFIG naming the
		// profile its NVML serves, which verify checks sysfs against.
		pairedVerify := func() containerdtest.Container {
			c := s.verifyContainer("verify")
			c.Env = append(c.Env, "MOCK_PCI_ROOT=", "MOCK_NVML_CONFIG="+profileInImage)
			return c
		}
		t.Run("annotated pod", func(t *testing.T) {
			if !s.routes.expectWith(t, supplied, programs.NvmlMockNRI, "NRI nvml-mock-nri (shims without libpcimocksys)", "`nvml-mock.nvidia.com/devices: \"true\"`", "verify passes, NVML's GPUs = sysfs's") {
				return
			}
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nvml-mock-devices", Annotations: map[string]string{
				"nvml-mock.nvidia.com/devices": "true",
			}}, pairedVerify())
			s.requireAllGreen(t, code, r)
		})
		// Both plugins on one node: theirs (index 10) gives a pod that asks
		// for nothing the overlay and NVML's environment, ours (90, node-
		// wide) the links directory; the overlay both mount is theirs,
		// which ours sees and does not mount again.
		t.Run("beside serve --nri", func(t *testing.T) {
			if !s.routes.expectWith(t, supplied, programs.NvmlMockNRI, "NRI nvml-mock-nri (shims without libpcimocksys) beside serve --nri", "nothing", "verify passes, NVML's GPUs = sysfs's: NVML's environment from theirs, the links directory from ours") {
				return
			}
			s.startServeNRI(t, false)
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nvml-mock-beside-serve"}, pairedVerify())
			s.requireAllGreen(t, code, r)
		})
		// Negative control: the plugin's defaults, a pod that leaves them.
		t.Run("its defaults are a second PCI mock", func(t *testing.T) {
			if !s.routes.expectWith(t, supplied, programs.NvmlMockNRI, "NRI nvml-mock-nri, its defaults", "`nvml-mock.nvidia.com/devices: \"true\"`", "verify fails: libpcimocksys preloaded") {
				return
			}
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nvml-mock-defaults", Annotations: map[string]string{
				"nvml-mock.nvidia.com/devices": "true",
			}}, s.verifyContainer("verify"))
			require.Equal(t, 1, code)
			require.Contains(t, r.FailedChecks(), verify.OtherMocks)
		})
		// Without the annotation it still mounts the overlay, but not the
		// links directory: consumers see the node's own PCI devices.
		t.Run("unannotated pod gets the overlay only", func(t *testing.T) {
			if !s.routes.expectWith(t, supplied, programs.NvmlMockNRI, "NRI nvml-mock-nri (shims without libpcimocksys)", "nothing", "verify fails: the overlay without the links directory") {
				return
			}
			code, r := s.verifyIn(t, containerdtest.Pod{Name: "nvml-mock-plain"}, pairedVerify())
			require.Equal(t, 1, code)
			failed := r.FailedChecks()
			require.Contains(t, failed, verify.LinksMount)
			require.NotContains(t, failed, verify.OverlayMount)
		})
		// Every container it adjusts gets its LD_PRELOAD shims and
		// MOCK_PCI_ROOT, which no flag turns off (an empty
		// --ld-preload-shims means its defaults). Our overlay has no shims
		// (the loader warns and goes on) and static programs ignore both.
		t.Run("its environment", func(t *testing.T) {
			if !s.routes.expectWith(t, supplied, programs.NvmlMockNRI, "NRI nvml-mock-nri, its defaults", "nothing (any pod)", "`LD_PRELOAD` of its shims and `MOCK_PCI_ROOT` set") {
				return
			}
			res := s.h.RunPod(t, containerdtest.Pod{Name: "nvml-mock-env"}).Run(t, containerdtest.Container{
				Name: "env", Image: containerdtest.ConsumerImage, Command: []string{"/usr/bin/env"},
				Mounts: []containerdtest.Mount{{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true}},
			})
			require.Equal(t, 0, res.ExitCode, res.Stderr)
			require.Contains(t, res.Stdout, "MOCK_PCI_ROOT="+plan.DefaultContainerRoot+"\n")
			require.Contains(t, res.Stdout, "LD_PRELOAD="+plan.DefaultContainerRoot+"/driver/usr/local/lib/libibmockumad.so.1:")
			require.Contains(t, res.Stderr, "cannot be preloaded", "the loader's warning about the missing shims")
			t.Logf("nvml-mock-nri's environment:\n%s", res.Stdout)
		})
	})
}

// startNvmlMockNRI runs nvml-mock's NRI plugin, bin, on s's tree,
// configured as docs/user/nvml-mock.md's switch-over says: its shims
// without libpcimocksys, the second PCI mock verify refuses.
func (s *served) startNvmlMockNRI(t testing.TB, bin string) *containerdtest.NRIPlugin {
	t.Helper()
	plugin := exec.Command(bin,
		"--socket-path", s.h.NRISocket,
		"--plugin-index", "10",
		"--health-addr", "",
		"--device-injection-mode", "cdi",
		"--cdi-device-name", device,
		"--cdi-spec-host-path", s.spec,
		"--overlay-host-path", s.root,
		"--overlay-mount-path", plan.DefaultContainerRoot,
	)
	plugin.Env = append(os.Environ(), "NVML_MOCK_LD_PRELOAD_SHIMS="+strings.Join(nvmlMockShimsWithoutPCI(), ","))
	return s.h.StartNRIPlugin(t, "10-nvml-mock", plugin)
}

// nvmlMockShimsWithoutPCI are nvml-mock-nri's default LD_PRELOAD shims
// (pkg/nri/nvmlmock defaultShims) less libpcimocksys: docs/user/nvml-mock.md's
// NVML_MOCK_LD_PRELOAD_SHIMS for the switch-over.
func nvmlMockShimsWithoutPCI() []string {
	return []string{
		"driver/usr/local/lib/libibmockumad.so.1",
		"driver/usr/local/lib/libibmockverbs.so.1",
		"driver/usr/local/lib/libibmocksys.so.1",
	}
}
