package serve

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writable"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// The profiles the tests write to: SR-IOV HCAs beside nvidia GPUs, and a
// passthrough node whose profile binds three GPUs to vfio-pci.
const (
	sriovProfile = "../../testdata/profiles/sriov.yaml"
	vfioProfile  = "../../testdata/profiles/vfio-passthrough.yaml"
)

// tree is a writable tree on disk, without FUSE: writes go to the
// controller as the FUSE server hands them over.
type tree struct {
	t    testing.TB
	root string
	c    *writableTree
}

func render(t testing.TB, root, prof string) *tree {
	t.Helper()
	c, err := openWritableTree(root, "")
	require.NoError(t, err)
	_, _, _, err = c.Render(renderOptions(root, prof))
	require.NoError(t, err)
	return &tree{t: t, root: root, c: c}
}

func renderOptions(root, prof string) overlay.Options {
	return overlay.Options{Root: root, Profile: prof, HostSysfs: "/nonexistent", Writer: writer.Options{SkipSync: true}}
}

func newTree(t *testing.T, prof string) *tree { return render(t, t.TempDir(), prof) }

// write writes data to a path as a writer names it: the kernel resolves
// every link before the FUSE server sees the path, so this does too.
func (tr *tree) write(p, data string) syscall.Errno {
	tr.t.Helper()
	rel := tr.resolve(p)
	_, errno := tr.c.Write(rel, []byte(data))
	return errno
}

// resolve follows p's links inside the tree, as the kernel would for a
// writer, and returns the path relative to the root.
func (tr *tree) resolve(p string) string {
	tr.t.Helper()
	rel, err := tr.resolved(p)
	require.NoError(tr.t, err)
	return rel
}

// resolved is resolve's answer, or why p's directory does not resolve (a
// VF's, before its physical function enables it).
func (tr *tree) resolved(p string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Join(tr.root, filepath.Dir(p)))
	if err != nil {
		return "", err
	}
	root, err := filepath.EvalSymlinks(tr.root)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(root, filepath.Join(dir, filepath.Base(p)))
	return filepath.ToSlash(rel), err
}

func (tr *tree) read(p string) string {
	tr.t.Helper()
	b, err := os.ReadFile(filepath.Join(tr.root, p))
	require.NoError(tr.t, err)
	return string(b)
}

// driver is the name of a device's driver link's target, "" with none.
func (tr *tree) driver(bdf string) string {
	tr.t.Helper()
	target, err := os.Readlink(filepath.Join(tr.root, "sys/bus/pci/devices", bdf, "driver"))
	if os.IsNotExist(err) {
		return ""
	}
	require.NoError(tr.t, err)
	return filepath.Base(target)
}

func (tr *tree) exists(p string) bool {
	_, err := os.Lstat(filepath.Join(tr.root, p))
	return err == nil
}

const gpu = "0000:18:00.0"

func dev(bdf, attr string) string { return "sys/bus/pci/devices/" + bdf + "/" + attr }
func drv(d, attr string) string   { return "sys/bus/pci/drivers/" + d + "/" + attr }

// TestBindToVFIOAndBack walks a GPU from nvidia to vfio-pci and back the
// way go-nvlib's nvpassthrough does, with every refusal the kernel gives
// on the way.
func TestBindToVFIOAndBack(t *testing.T) {
	tr := newTree(t, sriovProfile)
	require.Equal(t, "nvidia", tr.driver(gpu))
	require.Equal(t, "(null)\n", tr.read(dev(gpu, "driver_override")))
	require.True(t, tr.exists(drv("vfio-pci", "bind")), "vfio-pci is listed with no device bound")

	require.Equal(t, syscall.ENODEV, tr.write(drv("vfio-pci", "bind"), gpu), "vfio-pci's id table is empty: no override, no match")
	// The kernel's driver_set_override: up to a NUL, then up to a newline;
	// empty clears. Text that is not UTF-8 is refused (a deviation: the
	// state file is JSON), and a refused write changes nothing. Each case
	// starts from a known override, set first, so what it reads back
	// follows from its own writes alone, in whatever order the cases run.
	for _, c := range []struct {
		from, data string
		errno      syscall.Errno
		want       string
	}{
		{from: "\n", data: "x\x00y", want: "x\n"},
		{from: "other\n", data: "\x00vfio-pci", want: "(null)\n"},
		{from: "\n", data: "a\nb", want: "a\n"},
		{from: "other\n", data: "\n", want: "(null)\n"},
		{from: "\n", data: "\x80-pci", errno: syscall.EINVAL, want: "(null)\n"},
		{from: "other\n", data: "\x80-pci", errno: syscall.EINVAL, want: "other\n"},
	} {
		require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver_override"), c.from), "%q", c.from)
		require.Equal(t, c.errno, tr.write(dev(gpu, "driver_override"), c.data), "%q after %q", c.data, c.from)
		require.Equal(t, c.want, tr.read(dev(gpu, "driver_override")), "%q after %q", c.data, c.from)
	}
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver_override"), "\n"))
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver_override"), "vfio-pci\n"))
	require.Equal(t, "vfio-pci\n", tr.read(dev(gpu, "driver_override")))
	require.Equal(t, "nvidia", tr.driver(gpu), "an override alone changes no binding")
	require.Equal(t, syscall.EBUSY, tr.write(drv("vfio-pci", "bind"), gpu), "bound to nvidia still")
	require.Equal(t, syscall.ENODEV, tr.write(drv("vfio-pci", "unbind"), gpu), "not bound to vfio-pci")

	// nvpassthrough's Unbind writes to the device's driver/unbind.
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver/unbind"), gpu+"\n"))
	require.Equal(t, "", tr.driver(gpu))
	require.False(t, tr.exists(drv("nvidia", gpu)))
	require.NotContains(t, tr.read(dev(gpu, "uevent")), "DRIVER=")
	require.Equal(t, syscall.ENODEV, tr.write(drv("nvidia", "bind"), gpu), "the override names vfio-pci")

	require.Equal(t, syscall.Errno(0), tr.write(drv("vfio-pci", "bind"), gpu))
	require.Equal(t, "vfio-pci", tr.driver(gpu))
	require.True(t, tr.exists(drv("vfio-pci", gpu)))
	require.Equal(t, "511:0\n", tr.read(dev(gpu, "vfio-dev/vfio0/dev")))
	require.Contains(t, tr.read(dev(gpu, "uevent")), "DRIVER=vfio-pci\n")
	require.Equal(t, syscall.EBUSY, tr.write(drv("vfio-pci", "bind"), gpu))
	require.Equal(t, syscall.ENODEV, tr.write(drv("vfio-pci", "bind"), "0000:99:00.0"), "no such device")
	require.Equal(t, syscall.ENODEV, tr.write(drv("vfio-pci", "bind"), "18:00.0"), "names are compared whole")

	// And back, as nvpassthrough's BindToDriver("nvidia") does.
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver_override"), "\n"))
	require.Equal(t, "(null)\n", tr.read(dev(gpu, "driver_override")))
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver/unbind"), gpu))
	require.False(t, tr.exists(dev(gpu, "vfio-dev")))
	require.Equal(t, syscall.Errno(0), tr.write("sys/bus/pci/drivers_probe", gpu))
	require.Equal(t, "nvidia", tr.driver(gpu))
	require.Equal(t, syscall.Errno(0), tr.write("sys/bus/pci/drivers_probe", gpu), "a bound device: nothing to do")
	require.Equal(t, syscall.ENODEV, tr.write("sys/bus/pci/drivers_probe", "0000:99:00.0"))
}

// TestNotWritable: a write to anything but a writable attribute is refused
// as sysfs refuses a read-only attribute.
func TestNotWritable(t *testing.T) {
	tr := newTree(t, sriovProfile)
	for _, p := range []string{dev(gpu, "vendor"), dev(gpu, "config"), "effective-profile.json", drv("nvidia", "new_id"),
		dev("0000:16:00.0", "sriov_numvfs"), dev(gpu, "sriov_numvfs"), "sys/bus/pci/drivers/virtio-pci/bind", "../x"} {
		_, errno := tr.c.Write(p, []byte("1"))
		require.Equal(t, syscall.EACCES, errno, p)
	}
}

// TestVFIONumbers: a device bound to vfio-pci takes the lowest vfio number
// free, and the others keep theirs.
func TestVFIONumbers(t *testing.T) {
	tr := newTree(t, vfioProfile)
	number := func(bdf string) string {
		ents, err := os.ReadDir(filepath.Join(tr.root, dev(bdf, "vfio-dev")))
		if os.IsNotExist(err) {
			return ""
		}
		require.NoError(t, err)
		return ents[0].Name()
	}
	require.Equal(t, []string{"vfio0", "vfio1", "vfio2", ""}, []string{number("0000:18:00.0"), number("0000:2a:00.0"), number("0000:ba:00.0"), number("0000:db:00.0")})
	require.Equal(t, syscall.Errno(0), tr.write(dev("0000:2a:00.0", "driver/unbind"), "0000:2a:00.0"))
	require.Equal(t, syscall.Errno(0), tr.write(dev("0000:db:00.0", "driver_override"), "vfio-pci"))
	require.Equal(t, syscall.Errno(0), tr.write(dev("0000:db:00.0", "driver/unbind"), "0000:db:00.0"))
	require.Equal(t, syscall.Errno(0), tr.write("sys/bus/pci/drivers_probe", "0000:db:00.0"))
	require.Equal(t, []string{"vfio0", "", "vfio2", "vfio1"}, []string{number("0000:18:00.0"), number("0000:2a:00.0"), number("0000:ba:00.0"), number("0000:db:00.0")})
}

const pf = "0000:19:00.0"

// TestSRIOV: virtual functions come and go by sriov_numvfs, with the
// kernel's refusals.
func TestSRIOV(t *testing.T) {
	tr := newTree(t, sriovProfile)
	require.Equal(t, "8\n", tr.read(dev(pf, "sriov_totalvfs")))
	require.Equal(t, "0\n", tr.read(dev(pf, "sriov_numvfs")))

	// Each from 0 VFs, and each leaves 0: refused, or 0 again.
	for _, c := range []struct {
		data string
		want syscall.Errno
	}{{"9", syscall.ERANGE}, {"abc", syscall.EINVAL}, {"-1", syscall.EINVAL}, {"0b1", syscall.EINVAL}, {"1_0", syscall.EINVAL}, {"", syscall.EINVAL}, {"0", 0}} {
		require.Equal(t, "0\n", tr.read(dev(pf, "sriov_numvfs")), "before %q", c.data)
		require.Equal(t, c.want, tr.write(dev(pf, "sriov_numvfs"), c.data), "%q", c.data)
	}
	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "sriov_numvfs"), "4\n"))
	require.Equal(t, "4\n", tr.read(dev(pf, "sriov_numvfs")))
	for i, vf := range []string{"0000:19:00.1", "0000:19:00.2", "0000:19:00.3", "0000:19:00.4"} {
		target, err := os.Readlink(filepath.Join(tr.root, dev(pf, "virtfn"+string(rune('0'+i)))))
		require.NoError(t, err)
		require.Equal(t, "../"+vf, target)
		require.Equal(t, "0x101e\n", tr.read(dev(vf, "device")))
		require.Equal(t, "mlx5_core", tr.driver(vf), "sriov_drivers_autoprobe binds VFs")
		phys, err := filepath.EvalSymlinks(filepath.Join(tr.root, dev(vf, "physfn")))
		require.NoError(t, err)
		require.Equal(t, pf, filepath.Base(phys))
	}
	require.False(t, tr.exists(dev("0000:19:00.5", "vendor")))
	require.Equal(t, syscall.EBUSY, tr.write(dev(pf, "sriov_numvfs"), "2"), "N to M without 0")
	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "sriov_numvfs"), "0x4"), "the same number: nothing to do")

	// A VF goes to vfio-pci, as KubeVirt's SR-IOV passthrough wants it.
	vf := "0000:19:00.2"
	require.Equal(t, syscall.Errno(0), tr.write(dev(vf, "driver_override"), "vfio-pci"))
	require.Equal(t, syscall.Errno(0), tr.write(dev(vf, "driver/unbind"), vf))
	require.Equal(t, syscall.Errno(0), tr.write(drv("vfio-pci", "bind"), vf))
	require.Equal(t, "vfio-pci", tr.driver(vf))

	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "sriov_numvfs"), "0"))
	require.False(t, tr.exists(dev("0000:19:00.1", "vendor")))
	require.False(t, tr.exists(dev(pf, "virtfn0")))
	require.Empty(t, tr.c.Written()[mustParse(t, vf)], "a removed VF's state goes with it")

	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "driver/unbind"), pf))
	require.Equal(t, syscall.ENOENT, tr.write(dev(pf, "sriov_numvfs"), "2"), "no driver bound")
}

// TestUnbindDisablesVFs: unbinding a physical function's driver removes
// its virtual functions, as mlx5's remove does.
func TestUnbindDisablesVFs(t *testing.T) {
	tr := newTree(t, sriovProfile)
	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "sriov_numvfs"), "2"))
	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "driver/unbind"), pf))
	require.Equal(t, "0\n", tr.read(dev(pf, "sriov_numvfs")))
	require.False(t, tr.exists(dev("0000:19:00.1", "vendor")))
}

// TestStatePersists: writes survive a restart and a re-render that keeps
// the device; a profile without the device drops its state.
func TestStatePersists(t *testing.T) {
	root := t.TempDir()
	tr := render(t, root, sriovProfile)
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver_override"), "vfio-pci"))
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver/unbind"), gpu))
	require.Equal(t, syscall.Errno(0), tr.write(drv("vfio-pci", "bind"), gpu))
	require.Equal(t, syscall.Errno(0), tr.write(dev(pf, "sriov_numvfs"), "3"))

	again := render(t, root, sriovProfile) // a restart
	require.Equal(t, "vfio-pci", again.driver(gpu))
	require.Equal(t, "3\n", again.read(dev(pf, "sriov_numvfs")))
	require.True(t, again.exists(dev("0000:19:00.3", "vendor")))
	require.Contains(t, again.read(writable.StateFile), `"driver": "vfio-pci"`)

	// A profile that keeps the GPU but not the HCAs.
	noHCAs := filepath.Join(t.TempDir(), "p.yaml")
	data, err := os.ReadFile(sriovProfile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(noHCAs, []byte(strings.Replace(string(data), "enabled: true", "enabled: false", 1)), 0o644))
	_, _, changed, err := again.c.Render(renderOptions(root, noHCAs))
	require.NoError(t, err)
	require.NotEmpty(t, changed)
	require.Equal(t, "vfio-pci", again.driver(gpu))
	require.False(t, again.exists(dev(pf, "vendor")))
	require.NotContains(t, again.read(writable.StateFile), pf)

	// A profile with another GPU at the address drops the GPU's state.
	other := filepath.Join(t.TempDir(), "q.yaml")
	require.NoError(t, os.WriteFile(other, []byte(strings.Replace(string(data), "0x233010DE", "0x20B010DE", 1)), 0o644))
	_, _, _, err = again.c.Render(renderOptions(root, other))
	require.NoError(t, err)
	require.Equal(t, "nvidia", again.driver(gpu))
}

func mustParse(t *testing.T, s string) pciaddr.Address {
	t.Helper()
	a, err := pciaddr.Parse(s)
	require.NoError(t, err)
	return a
}

// TestBridge: a bridge leaves pcieport and comes back by drivers_probe, as
// the kernel lets it.
func TestBridge(t *testing.T) {
	tr := newTree(t, sriovProfile)
	const bridge = "0000:16:00.0"
	require.Equal(t, "pcieport", tr.driver(bridge))
	require.Equal(t, syscall.Errno(0), tr.write(drv("pcieport", "unbind"), bridge))
	require.Equal(t, "", tr.driver(bridge))
	require.Equal(t, syscall.Errno(0), tr.write("sys/bus/pci/drivers_probe", bridge))
	require.Equal(t, "pcieport", tr.driver(bridge))
}

// TestWriteReadsNoProfile: a write(2) plans from the machine the last
// render normalised. It reads no profile (one removed since still
// answers) and warns of nothing: serve's Sync collects a render's
// warnings in a slice its log reads with no lock while the FUSE server
// writes, so a write that called the render's Warn raced with that read
// (go test -race saw it).
func TestWriteReadsNoProfile(t *testing.T) {
	data, err := os.ReadFile(sriovProfile)
	require.NoError(t, err)
	prof := filepath.Join(t.TempDir(), "unknown-key.yaml")
	require.NoError(t, os.WriteFile(prof, []byte(strings.Replace(string(data), "devices:\n", "devicez: 1\ndevices:\n", 1)), 0o644))
	root := t.TempDir()
	c, err := openWritableTree(root, "")
	require.NoError(t, err)
	var unknown []error
	opts := renderOptions(root, prof)
	opts.Warn = func(err error) { unknown = append(unknown, err) }
	_, _, _, err = c.Render(opts)
	require.NoError(t, err)
	require.Len(t, unknown, 1)
	tr := &tree{t: t, root: root, c: c}
	override := tr.resolve(dev(gpu, "driver_override"))

	wrote := make(chan syscall.Errno)
	go func() {
		_, errno := c.Write(override, []byte("vfio-pci"))
		wrote <- errno
	}()
	logged := len(unknown) // as serve's logRender reads them, the write going on
	require.Equal(t, syscall.Errno(0), <-wrote)
	require.Equal(t, 1, logged)
	require.Len(t, unknown, 1, "a write warned again")

	require.NoError(t, os.Remove(prof))
	require.Equal(t, syscall.Errno(0), tr.write(dev(gpu, "driver/unbind"), gpu), "a write read the profile again")
	require.Equal(t, "", tr.driver(gpu))
}
