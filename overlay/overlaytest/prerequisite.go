package overlaytest

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
)

// UnderMakeEnv is set by the Makefile's test targets (make test, e2e,
// e2e-k8s), which install every prerequisite first: a missing one then
// fails the test instead of skipping it, so a run that could not cover a
// suite is never green. A developer's own go test skips, saying why.
const UnderMakeEnv = "NVML_MOCK_SYSFS_UNDER_MAKE"

// Missing stops t for a prerequisite that is missing (root, a program, the
// shared data, a device of this machine): a skip saying why, or under make
// a failure saying the same. It is the one place a test skips for what the
// machine lacks.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv(UnderMakeEnv) != "" {
		t.Fatalf("%s is set (a make target, which installs every prerequisite), so this cannot be skipped: %s", UnderMakeEnv, why)
	}
	t.Skip(why)
}

// RequireFUSE stops t (Missing) where this process cannot mount FUSE
// (FUSEUnusable), which the writable mode (serve --writable) serves its
// view through.
func RequireFUSE(t testing.TB) {
	t.Helper()
	if why := FUSEUnusable(); why != "" {
		Missing(t, "%s: the writable mode serves its view through FUSE", why)
	}
}

// FUSEUnusable says why this process cannot mount FUSE, or "": for a
// TestMain, which has no test to stop, deciding where to run.
func FUSEUnusable() string {
	if os.Geteuid() != 0 {
		return "mounting FUSE needs root"
	}
	st, err := os.Stat("/dev/fuse")
	if err != nil {
		return "no /dev/fuse: " + err.Error()
	}
	if st.Mode()&os.ModeCharDevice == 0 {
		return "/dev/fuse is not a character device"
	}
	return ""
}

// SkipUnlessRoot stops the test (Missing) unless it runs as root, saying
// what needs root: for tests that need root but no mount namespace
// (RequireRoot).
func SkipUnlessRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "needs root: %s", why)
	}
}

// RequireRoot stops the test (Missing), saying why, unless it runs as root
// with every named program installed. make test installs them when it
// runs as root.
func RequireRoot(t testing.TB, programs ...string) {
	t.Helper()
	SkipUnlessRoot(t, "mount namespaces and bind mounts")
	for _, p := range append([]string{"unshare"}, programs...) {
		if _, err := exec.LookPath(p); err != nil {
			Missing(t, "%s is not installed (make test installs it from Debian when run as root)", p)
		}
	}
}

// RequireProgram returns a program's path, or stops the test (Missing)
// saying which Debian package has it (make deps installs it as root).
func RequireProgram(t testing.TB, name, debianPackage string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "%s is not installed (Debian package %s; make deps installs it as root): %v", name, debianPackage, err)
	}
	return p
}
