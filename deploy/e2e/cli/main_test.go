// Package cli drives the built nvml-mock-sysfs binary as its users do: as
// a separate process, under podman, as the DaemonSet's container and in a
// private mount namespace. The in-process tests of each command stay
// beside it in cmd/nvml-mock-sysfs.
package cli

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// binaries holds the static binary that the tests share: built once per
// test binary, not once per test.
var binaries hosttest.Binaries

func TestMain(m *testing.M) {
	os.Exit(binaries.Removed(overlaytest.Main(m)))
}
