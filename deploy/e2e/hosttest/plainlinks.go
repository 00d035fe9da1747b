package hosttest

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// PlainLinksCopy copies an overlay and rewrites each endpoint's anchored
// link to the plain escaped form for the container root the render
// recorded (the default where it recorded none), which resolves to the
// same device but which deviceattribute's pcieRoot rejects: the negative
// control of every test that a consumer gets pcieRoot. Bridges already
// have the plain form.
func PlainLinksCopy(t testing.TB, root string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "plain")
	if out, err := exec.Command("cp", "-a", root, dst).CombinedOutput(); err != nil {
		t.Fatalf("copy %s: %v\n%s", root, err, out)
	}
	containerRoot := plan.DefaultContainerRoot
	if m, err := writer.ReadMarker(os.DirFS(dst)); err == nil && m.ContainerRoot != "" {
		containerRoot = m.ContainerRoot
	}
	links := filepath.Join(dst, plan.LinksDir)
	entries, err := os.ReadDir(links)
	if err != nil {
		t.Fatal(err)
	}
	rewritten := 0
	for _, e := range entries {
		p := filepath.Join(links, e.Name())
		target, err := os.Readlink(p)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(target, "../") {
			continue // a bridge (or a host device): already plain
		}
		sysPath := strings.TrimPrefix(path.Clean(path.Join(plan.LinksDir, target)), "sys/")
		if !strings.HasPrefix(sysPath, "devices/pci") {
			t.Fatalf("%s -> %s: cleans to %s, not under devices/pci", p, target, sysPath)
		}
		if err := os.Remove(p); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(plan.EscapedTarget(containerRoot, sysPath), p); err != nil {
			t.Fatal(err)
		}
		rewritten++
	}
	if rewritten == 0 {
		t.Fatalf("%s: no anchored link to rewrite", links)
	}
	return dst
}
