package overlaytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// ReadmeShell returns the README's shell blocks (```sh) as section heading
// -> the block's command lines, in order, blank lines and comments left
// out. Every command the README shows is in such a block, and each block
// is some test's to check: the quick start in cmd/nvml-mock-sysfs, the
// Kubernetes quick start in deploy (and, step for step, in the Kubernetes
// suite). A section may hold one block.
func ReadmeShell(t testing.TB) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(Repo(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]string{}
	var section string
	var in, seen bool
	for _, line := range strings.Split(string(data), "\n") {
		switch {
		case in && strings.HasPrefix(line, "```"):
			in = false
		case in:
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				blocks[section] = append(blocks[section], line)
			}
		case strings.HasPrefix(line, "## "):
			section, seen = strings.TrimPrefix(line, "## "), false
		case line == "```sh":
			if seen {
				t.Fatalf("README.md: section %q has two shell blocks; give each its own section", section)
			}
			in, seen = true, true
		}
	}
	return blocks
}
