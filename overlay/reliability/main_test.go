package reliability

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest/rendered"
)

// shared holds the real binary, built once for all the tests.
var shared rendered.Trees

// TestMain lets the flip test re-run this test binary as its reader inside a
// private mount namespace (see scanner_test.go).
func TestMain(m *testing.M) {
	if overlaytest.ChildMode() == scannerMode {
		os.Exit(scannerMain(os.Stdin, os.Stdout))
	}
	code := overlaytest.Main(m)
	shared.Close()
	os.Exit(code)
}
