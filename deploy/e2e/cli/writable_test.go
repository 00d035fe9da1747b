package cli

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fusetree"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// sriovProfile has two GPUs on nvidia, each beside an HCA with SR-IOV.
const sriovProfile = "../../../testdata/profiles/sriov.yaml"

// shellRootfs is a container root that borrows the host's /usr read-only
// for a shell, with its own /lib: a runtime creates the mount target of
// the writable spec's modules.alias stand-in under /lib/modules, which a
// read-only /usr could not take.
func (x *e2e) shellRootfs() (string, []string) {
	x.t.Helper()
	dir := filepath.Join(x.t.TempDir(), "rootfs")
	require.NoError(x.t, os.MkdirAll(filepath.Join(dir, "usr"), 0o755))
	require.NoError(x.t, os.MkdirAll(filepath.Join(dir, "lib"), 0o755))
	for _, l := range []string{"bin", "sbin", "lib64"} {
		require.NoError(x.t, os.Symlink("usr/"+l, filepath.Join(dir, l)))
	}
	require.NoError(x.t, os.Symlink("../usr/lib/x86_64-linux-gnu", filepath.Join(dir, "lib/x86_64-linux-gnu")))
	return dir, []string{"-v", "/usr:/usr:ro"}
}

// TestPodmanWritable: podman and runc apply serve --writable's CDI spec as
// it stands, and a container binds a GPU to vfio-pci by writes, as
// nvpassthrough makes them; another container, and the host, see it bound.
// The default spec's container gets "Read-only file system" for the same
// writes.
func TestPodmanWritable(t *testing.T) {
	x := newE2E(t)
	overlaytest.RequireFUSE(t)
	root := filepath.Join(t.TempDir(), "root")
	spec, kind := x.specFile("pcisysfs")
	serve := exec.Command(x.bin, "serve", "--writable", "--writable-tree", filepath.Join(t.TempDir(), "tree"),
		"--profile", sriovProfile, "--root", root, "--output", spec, "--kind", kind,
		"--listen", "127.0.0.1:0", "--no-watch")
	// serve writes its log to a file, which the test reads while it runs:
	// a strings.Builder would be written by exec's copying goroutine as the
	// test reads it (go test -race caught that).
	logFile, err := os.Create(filepath.Join(t.TempDir(), "serve.log"))
	require.NoError(t, err)
	defer logFile.Close()
	serve.Stderr = logFile
	log := func() string {
		data, err := os.ReadFile(logFile.Name())
		if err != nil {
			return err.Error()
		}
		return string(data)
	}
	require.NoError(t, serve.Start())
	t.Cleanup(func() {
		_ = serve.Process.Signal(syscall.SIGTERM)
		_ = serve.Wait()
		// Whatever happened, no view is left on the host.
		if fuse, _ := fusetree.IsFUSEMount(root); fuse {
			_ = syscall.Unmount(root, syscall.MNT_DETACH)
			t.Errorf("serve left its view mounted at %s; detached it", root)
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for _, err := os.Stat(spec); err != nil; _, err = os.Stat(spec) {
		require.True(t, time.Now().Before(deadline), "serve --writable wrote no spec in 20 s: %s", log())
		time.Sleep(50 * time.Millisecond)
	}
	device := kind + "=" + cdispec.DeviceName
	const gpu = "0000:18:00.0"
	bind := "set -e\n" + hosttest.VFIOBindScript(gpu)
	dir, extra := x.shellRootfs()
	code, stdout, stderr := x.podman(device, dir, extra, "/bin/sh", "-c", bind)
	require.Equal(t, 0, code, "in a container of the writable spec: %s%s\nserve: %s", stdout, stderr, log())
	require.Equal(t, "(null)\nvfio-pci\nvfio0\n", stdout)

	// Another container, started after, and the host see the binding.
	code, stdout, stderr = x.podman(device, dir, extra, "/bin/sh", "-c", fmt.Sprintf(`basename "$(readlink /sys/bus/pci/devices/%s/driver)"`, gpu))
	require.Equal(t, 0, code, stderr)
	require.Equal(t, "vfio-pci\n", stdout)
	target, err := os.Readlink(filepath.Join(root, "sys/bus/pci/devices", gpu, "driver"))
	require.NoError(t, err)
	require.Equal(t, "vfio-pci", filepath.Base(target))

	// Negative control: the default mode's spec of the same profile.
	plain := x.render(sriovProfile)
	plainSpec, plainKind := x.specFile("pcisysfs")
	x.cli("cdi", "--root", plain, "--output", plainSpec, "--kind", plainKind)
	code, stdout, stderr = x.podman(plainKind+"="+cdispec.DeviceName, dir, extra, "/bin/sh", "-c", bind)
	require.NotEqual(t, 0, code, "the read-only tree took a write: %s", stdout)
	require.Contains(t, stderr, "Read-only file system")
}
