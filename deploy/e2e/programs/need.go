package programs

import (
	"path/filepath"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// SkipShort skips the real-consumer and runtime end-to-end suites under
// go test -short, saying so: they build programs and run daemons, and
// -short is the quick tier's promise (make test-quick).
func SkipShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short skips the end-to-end suites with real consumers and runtimes (make e2e runs them)")
	}
}

// Need returns the output directory of p, built or taken from the cache.
// A build failure fails the test, naming the program and the step; it is
// never a skip.
func Need(t testing.TB, p Program) string {
	t.Helper()
	SkipShort(t)
	dir, err := Cache{Repo: overlaytest.Repo(t)}.Build(p)
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// NeedBinary is Need for a program with one output, returning its path.
func NeedBinary(t testing.TB, p Program) string {
	t.Helper()
	return filepath.Join(Need(t, p), p.Outputs[0])
}
