package reliability

import (
	"flag"
	"os"
	"strconv"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// waitingTests is how many of this package's tests run at once.
const waitingTests = 8

// binaries holds the real binary, built once for all the tests.
var binaries hosttest.Binaries

// TestMain lets the flip test re-run this test binary as its reader inside a
// private mount namespace (see scanner_test.go).
func TestMain(m *testing.M) {
	if hosttest.ChildMode() == scannerMode {
		os.Exit(scannerMain(os.Stdin, os.Stdout))
	}
	// The trials here wait, on the real binary's renders, on their kills
	// and on the reader in its own process, far more than they use this
	// process's CPU: unless -parallel is given, let them wait together
	// rather than GOMAXPROCS at a time (the crash test's workers would
	// otherwise queue behind the flip test).
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		if err := flag.Set("test.parallel", strconv.Itoa(waitingTests)); err != nil {
			panic(err)
		}
	}
	os.Exit(binaries.Removed(overlaytest.Main(m)))
}
