package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestServeUsageErrors(t *testing.T) {
	root := filepath.Join(t.TempDir(), "overlay")
	for _, args := range [][]string{
		{"serve", "--root", root}, // no spec target
		{"serve", "--root", root, "--merge-into", "/x.yaml", "--kind", "a.com/b"}, // --kind without --output
		{"serve", "--root", root, "--output", "/x.yaml", "--kind", "nokind"},
		{"serve", "--root", root, "--output", "/x.yaml", "--log-format", "xml"},
		{"serve", "--root", root, "--output", "/x.yaml", "--log-level", "loud"},
		{"serve", "--root", root, "--output", "/x.yaml", "--also-at", "/host/sys/bus/pci/devices"},
		{"serve", "--root", "relative", "--output", "/x.yaml"},
		{"serve", "--root", root, "--output", "/x.yaml", "--hierarchy", "mesh"},
	} {
		code, _, stderr := runCLI(t, args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, stderr)
		require.NotEmpty(t, stderr)
	}
	code, _, stderr := runCLI(t, "serve", "-h")
	require.Equal(t, exitOK, code)
	require.Contains(t, stderr, "-listen")
}
