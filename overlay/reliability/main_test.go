package reliability

import (
	"os"
	"testing"
)

// TestMain lets the flip test re-run this test binary as its reader inside a
// private mount namespace (see scanner_test.go).
func TestMain(m *testing.M) {
	if root := os.Getenv(scannerEnv); root != "" {
		os.Exit(scannerMain(root, os.Stdin, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
