package overlaytest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// RequireRoot skips, saying why, unless the test runs as root with every
// named program installed. make test installs them when it runs as root.
func RequireRoot(t testing.TB, programs ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for mount namespaces and bind mounts")
	}
	for _, p := range append([]string{"unshare"}, programs...) {
		if _, err := exec.LookPath(p); err != nil {
			t.Skipf("%s is not installed (make test installs it from Debian when run as root)", p)
		}
	}
}

// RequireProgram returns a program's path, or skips the test saying which
// Debian package has it (make deps installs it as root).
func RequireProgram(t testing.TB, name, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Skipf("%s is not installed (Debian package %s; make deps installs it as root): %v", name, debianPackage, err)
	}
	return p
}

// BuildBinary builds the static nvml-mock-sysfs binary into a temporary
// directory and returns its path.
func BuildBinary(t testing.TB) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH, so the real binary cannot be built: " + err.Error())
	}
	out := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", out, "./cmd/nvml-mock-sysfs")
	cmd.Dir = Repo(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	return out
}

// MountScript is the shell that, inside a private mount namespace, gives
// this process what a served container gets: the overlay read-only at its
// container root and the links directory read-only at /sys/bus/pci/devices.
// A tmpfs over the container root's parent keeps the host's / untouched.
func MountScript(root, containerRoot string) string {
	parent := filepath.Dir(containerRoot)
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
	return strings.Join([]string{
		"set -eu",
		"mount -t tmpfs tmpfs " + q(parent),
		"mkdir -p " + q(containerRoot),
		"mount --bind " + q(root) + " " + q(containerRoot),
		"mount -o remount,bind,ro " + q(containerRoot),
		"mount --bind " + q(root+"/sys/bus/pci/devices") + " /sys/bus/pci/devices",
		"mount -o remount,bind,ro /sys/bus/pci/devices",
	}, "\n") + "\n"
}

// InNamespace runs a shell script after MountScript in a private mount
// namespace and returns its combined output.
func InNamespace(t testing.TB, root, containerRoot, script string) (string, error) {
	t.Helper()
	cmd := exec.Command("unshare", "--mount", "--propagation", "private", "sh", "-c", MountScript(root, containerRoot)+script)
	out, err := cmd.CombinedOutput()
	return string(out), err
}
