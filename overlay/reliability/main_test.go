package reliability

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// TestMain lets the flip test re-run this test binary as its reader inside a
// private mount namespace (see scanner_test.go).
func TestMain(m *testing.M) {
	if overlaytest.ChildMode() == scannerMode {
		os.Exit(scannerMain(os.Stdin, os.Stdout))
	}
	os.Exit(m.Run())
}
