package cli

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// The end-to-end tests run real containers: podman 4.3 reads the CDI spec
// from /var/run/cdi through the CDI library and runc starts an unprivileged
// container with podman's read-only sysfs. The profile is one the renderer
// was not tuned against: two PCI domains, three root complexes, NUMA -1
// and 1.
const (
	unseenProfile = "../../../testdata/two-domains.yaml"
	cdiSpecDir    = "/var/run/cdi"
)

type e2e struct {
	t      *testing.T
	bin    string // the static binary, shared by the tests (binaries)
	rootfs string // a container root holding only the binary
}

func newE2E(t *testing.T) *e2e {
	t.Helper()
	overlaytest.SkipUnlessRoot(t, "podman injects CDI specs from /var/run/cdi and bind-mounts the overlay")
	for _, p := range [][2]string{{"podman", "podman"}, {"runc", "runc"}, {"lspci", "pciutils"}, {"cp", "coreutils"}} {
		overlaytest.RequireProgram(t, p[0], p[1])
	}
	if out, err := exec.Command("podman", "--version").CombinedOutput(); err != nil {
		overlaytest.Missing(t, "podman does not run here: %v: %s", err, out)
	}
	holdCDISpecDir(t)
	dir := t.TempDir()
	bin := binaries.Binary(t)
	rootfs := filepath.Join(dir, "rootfs")
	require.NoError(t, os.MkdirAll(rootfs, 0o755))
	require.NoError(t, exec.Command("cp", bin, filepath.Join(rootfs, "nvml-mock-sysfs")).Run())
	// For verify --profile in a container that did not get the overlay.
	require.NoError(t, exec.Command("cp", unseenProfile, filepath.Join(rootfs, "two-domains.yaml")).Run())
	return &e2e{t: t, bin: bin, rootfs: rootfs}
}

// cli runs the built binary on the host and requires success.
func (x *e2e) cli(args ...string) string {
	x.t.Helper()
	out, err := exec.Command(x.bin, args...).CombinedOutput()
	require.NoError(x.t, err, "nvml-mock-sysfs %s: %s", strings.Join(args, " "), out)
	return string(out)
}

// render renders as the deploy path does: with the node's own PCI devices
// listed, which verify checks.
func (x *e2e) render(profileFile string) string {
	x.t.Helper()
	root := filepath.Join(x.t.TempDir(), "overlay")
	x.cli("render", "--root", root, "--profile", profileFile, "--host-devices", "merge")
	return root
}

// holdCDISpecDir makes the host's /var/run/cdi ready for the test's specs:
// podman 4.3 reads CDI specs from /etc/cdi and /var/run/cdi only, with no
// flag or containers.conf key to name another directory, so the specs
// must go there. The test holds the host paths meanwhile (test binaries
// running beside it then never see its specs), and removes the directory
// at its end if it made it, after its specs (cleanups run last first).
func holdCDISpecDir(t *testing.T) {
	t.Helper()
	overlaytest.HoldHostPaths(t)
	if _, err := os.Lstat(cdiSpecDir); err == nil {
		return
	}
	require.NoError(t, os.MkdirAll(cdiSpecDir, 0o755))
	t.Cleanup(func() {
		if err := os.Remove(cdiSpecDir); err != nil {
			t.Errorf("remove the %s this test made: %v", cdiSpecDir, err)
		}
	})
}

// specFile names a CDI spec in /var/run/cdi, unique to this test, with a
// kind no other spec uses, and removes it when the test ends.
func (x *e2e) specFile(class string) (file, kind string) {
	x.t.Helper()
	b := make([]byte, 6)
	_, err := rand.Read(b)
	require.NoError(x.t, err)
	id := hex.EncodeToString(b)
	file = filepath.Join(cdiSpecDir, "nvml-mock-sysfs-e2e-"+id+".yaml")
	x.t.Cleanup(func() { _ = os.Remove(file) })
	return file, "e2e-" + id + ".nvml-mock.test/" + class
}

// podman runs a container and returns its exit code and output.
func (x *e2e) podman(device, rootfs string, extra []string, cmd ...string) (int, string, string) {
	x.t.Helper()
	args := []string{"run", "--rm", "--network=none", "--ulimit", "nofile=10000:10000", "--ulimit", "nproc=1000:1000"}
	if device != "" {
		args = append(args, "--device", device)
	}
	args = append(args, extra...)
	args = append(args, "--rootfs", rootfs)
	args = append(args, cmd...)
	var stdout, stderr bytes.Buffer
	c := exec.Command("podman", args...)
	c.Stdout, c.Stderr = &stdout, &stderr
	err := c.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else {
		require.NoError(x.t, err)
	}
	return code, stdout.String(), stderr.String()
}

// verify runs verify in a container of the minimal rootfs.
func (x *e2e) verify(device string, args ...string) (int, *compat.Report) {
	x.t.Helper()
	code, stdout, stderr := x.podman(device, x.rootfs, nil, append([]string{"/nvml-mock-sysfs", "verify", "--format", "json"}, args...)...)
	var r compat.Report
	require.NoError(x.t, json.Unmarshal([]byte(stdout), &r), "verify printed no report (exit %d): %s %s", code, stdout, stderr)
	return code, &r
}

// lspciRootfs is a container root that borrows the host's /usr read-only,
// for lspci: an independent reader of the tree (libpci, in C).
func (x *e2e) lspciRootfs() (string, []string) {
	x.t.Helper()
	dir := filepath.Join(x.t.TempDir(), "rootfs")
	require.NoError(x.t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		require.NoError(x.t, os.Symlink("usr/"+l, filepath.Join(dir, l)))
	}
	return dir, []string{"-v", "/usr:/usr:ro"}
}

func (x *e2e) lspci(device string, args ...string) string {
	x.t.Helper()
	dir, extra := x.lspciRootfs()
	code, stdout, stderr := x.podman(device, dir, extra, append([]string{"/usr/bin/lspci"}, args...)...)
	require.Equal(x.t, 0, code, "lspci in a container: %s", stderr)
	return stdout
}

func loadUnseen(t *testing.T) *profile.Machine {
	t.Helper()
	p, err := profile.LoadFile(unseenProfile)
	require.NoError(t, err)
	m, err := profile.Normalize(unseenProfile, p, profile.Options{})
	require.NoError(t, err)
	return m
}

func TestPodmanServesTheSpec(t *testing.T) {
	x := newE2E(t)
	m := loadUnseen(t)
	root := x.render(unseenProfile)
	spec, kind := x.specFile("pcisysfs")
	x.cli("cdi", "--root", root, "--output", spec, "--kind", kind, "--also-at", "/host-sys/bus/pci/devices")
	device := kind + "=" + cdispec.DeviceName

	t.Run("verify passes in the container", func(t *testing.T) {
		code, r := x.verify(device)
		require.Equal(t, 0, code, "failures: %+v", r.Failures())
		require.True(t, r.OK())
		var roots []string
		for _, c := range r.Results {
			if c.Check == "deviceattribute.pcieRoot" {
				roots = append(roots, c.Device+" "+c.Detail)
			}
		}
		var want []string
		for _, d := range m.Devices {
			want = append(want, d.Address.String()+" "+d.RootComplex.String())
		}
		require.Equal(t, want, roots, "pcieRoot of every device, through the library's defaults")
	})

	t.Run("lspci in the container sees the profile", func(t *testing.T) {
		// The independent checker: libpci scans /sys/bus/pci/devices.
		list := x.lspci(device, "-D", "-n")
		for _, d := range m.Devices {
			line := fmt.Sprintf("%s %04x: %04x:%04x (rev %02x)", d.Address, d.Class>>8, d.Vendor, d.DeviceID, d.Revision)
			require.Contains(t, list, line+"\n")
		}
		require.Equal(t, len(m.Devices), strings.Count(list, " 10de:"), "no other NVIDIA function")
		tree := x.lspci(device, "-t", "-D")
		for _, rc := range m.RootComplexes {
			id := strings.TrimPrefix(rc.ID.String(), "pci")
			require.Contains(t, tree, "["+id+"]", "root complex %s in lspci -t:\n%s", id, tree)
		}
	})

	t.Run("the links resolve at the also-at target, run from the overlay's binary", func(t *testing.T) {
		// As NFD's DaemonSet has it: the node's /sys at /host-sys, where the
		// node's own devices' kernel-form links lead.
		code, stdout, stderr := x.podman(device, x.rootfs, []string{"-v", "/sys:/host-sys:ro"}, path.Join(plan.DefaultContainerRoot, plan.BinaryFile), "compat", "--sysfs", "/host-sys")
		require.Equal(t, 0, code, "%s%s", stdout, stderr)
		require.Contains(t, stdout, "at /host-sys, 0 failed")
	})

	t.Run("without the device the container sees the host's own devices", func(t *testing.T) {
		code, r := x.verify("", "--profile", "/two-domains.yaml")
		require.Equal(t, 1, code)
		failed := r.FailedChecks()
		require.Contains(t, failed, verify.LinksMount)
		require.Contains(t, failed, "deviceattribute.pcieRoot")
		host, err := exec.Command("lspci", "-D", "-n").Output()
		require.NoError(t, err)
		require.Equal(t, string(host), x.lspci("", "-D", "-n"))
		t.Logf("FIGURES without the device: %d of %d checks fail", len(r.Failures()), len(r.Results))
	})

	t.Run("plain escaped links fail verify on pcieRoot alone", func(t *testing.T) {
		plain := hosttest.PlainLinksCopy(t, root)
		plainSpec, plainKind := x.specFile("pcisysfs")
		x.cli("cdi", "--root", plain, "--output", plainSpec, "--kind", plainKind)
		code, r := x.verify(plainKind + "=" + cdispec.DeviceName)
		require.Equal(t, 1, code)
		require.Equal(t, []string{"deviceattribute.pcieRoot"}, r.FailedChecks(), "everything else reads through the links and passes")
		for _, c := range r.Failures() {
			require.Contains(t, c.Detail, "must start with devices/pci")
		}
	})
}

func TestPodmanMergedSpec(t *testing.T) {
	x := newE2E(t)
	root := x.render(unseenProfile)
	file, kind := x.specFile("gpu")

	// nvml-mock's shape: a whole mock /sys/devices bind-mounted over the
	// kernel's, beside the driver's own edits.
	wholeDevices := filepath.Join(t.TempDir(), "sys-devices")
	require.NoError(t, os.MkdirAll(filepath.Join(wholeDevices, "system/cpu"), 0o755))
	hookTimeout := 10
	orig := &specs.Spec{
		Version: "0.5.0",
		Kind:    kind,
		Devices: []specs.Device{
			{Name: "0", ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia-mock0", HostPath: "/dev/null"}}}},
			{Name: "all", ContainerEdits: specs.ContainerEdits{DeviceNodes: []*specs.DeviceNode{{Path: "/dev/nvidia-mock0", HostPath: "/dev/null"}}}},
		},
		ContainerEdits: specs.ContainerEdits{
			Env:   []string{"NVIDIA_VISIBLE_DEVICES=void"},
			Hooks: []*specs.Hook{{HookName: "createRuntime", Path: "/bin/true", Args: []string{"true"}, Timeout: &hookTimeout}},
			Mounts: []*specs.Mount{
				{HostPath: unseenAbs(t), ContainerPath: "/etc/nvml-mock/config.yaml", Options: []string{"ro", "nosuid", "nodev", "bind"}},
				{HostPath: wholeDevices, ContainerPath: cdispec.WholeDevicesDir, Options: []string{"ro", "nosuid", "nodev", "bind"}},
			},
		},
	}
	_, err := cdispec.WriteSpec(file, orig)
	require.NoError(t, err)
	device := kind + "=all"

	code, r := x.verify(device, "--profile", "/two-domains.yaml")
	require.Equal(t, 1, code, "before the merge")
	require.Contains(t, r.FailedChecks(), verify.KernelDevices, "the whole-devices mount hides the kernel's /sys/devices")

	// Ours are the mount set (cdispec.Mounts, its one home): the overlay,
	// its links directory, the module view and the node's modules beside it.
	ours, err := cdispec.Mounts(root, "", nil)
	require.NoError(t, err)
	out := x.cli("cdi", "--root", root, "--merge-into", file)
	require.Contains(t, out, fmt.Sprintf("removed 1 mounts, added %d", len(ours)))
	merged, err := cdispec.ReadSpec(file)
	require.NoError(t, err)
	require.Equal(t, orig.Version, merged.Version)
	require.Equal(t, orig.Devices, merged.Devices)
	machineEnv := cdispec.MachineTypeFileEnv + "=" + path.Join(plan.DefaultContainerRoot, plan.ProductNameFile)
	require.Equal(t, append(slices.Clone(orig.ContainerEdits.Env), machineEnv), merged.ContainerEdits.Env, "the spec's own variables stay; GFD's machine-type file joins them")
	require.Equal(t, orig.ContainerEdits.Hooks, merged.ContainerEdits.Hooks)
	want := []string{"/etc/nvml-mock/config.yaml"}
	for _, m := range ours {
		want = append(want, m.Destination)
	}
	require.Equal(t, want, containerPathsIn(merged.ContainerEdits.Mounts))
	before, err := os.ReadFile(file)
	require.NoError(t, err)

	require.Contains(t, x.cli("cdi", "--root", root, "--merge-into", file), "unchanged")
	after, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, string(before), string(after), "idempotent")

	code, r = x.verify(device)
	require.Equal(t, 0, code, "after the merge: %+v", r.Failures())

	// GFD's machine label needs no flag: podman 4.3 takes the merged spec
	// (its cdiVersion unchanged) and sets the variable, which names the
	// profile's machine type as the container sees it.
	dir, extra := x.lspciRootfs()
	code, stdout, stderr := x.podman(device, dir, extra, "/usr/bin/sh", "-c", `cat "$`+cdispec.MachineTypeFileEnv+`"`)
	require.Equal(t, 0, code, "%s", stderr)
	require.Equal(t, loadUnseen(t).ProductName+"\n", stdout)
}

func unseenAbs(t *testing.T) string {
	t.Helper()
	p, err := filepath.Abs(unseenProfile)
	require.NoError(t, err)
	return p
}

func containerPathsIn(ms []*specs.Mount) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.ContainerPath)
	}
	return out
}
