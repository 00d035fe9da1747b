// Package overlaytest holds helpers for tests of rendered trees: snapshots
// to compare trees byte for byte, and the location of the project's shared
// test data.
package overlaytest

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Snapshot describes every path under root, without following links: kind,
// permission bits, and a file's content or a link's text. Two trees are
// byte-for-byte equal exactly when their snapshots are.
func Snapshot(root string) (map[string]string, error) {
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			out[rel] = "link " + target
		case d.IsDir():
			out[rel] = fmt.Sprintf("dir %v", info.Mode())
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			out[rel] = fmt.Sprintf("file %v %q", info.Mode(), data)
		default:
			out[rel] = fmt.Sprintf("special %v", info.Mode())
		}
		return nil
	})
	return out, err
}

// SharedTestdata returns the absolute path of ../shared/testdata/<sub>
// beside the repository, or skips the test, saying why, when it is absent.
func SharedTestdata(t testing.TB, sub string) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Skip("cannot locate the repository to find ../shared")
	}
	repo := filepath.Join(filepath.Dir(file), "..", "..")
	dir := filepath.Join(repo, "..", "shared", "testdata", sub)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("%s is absent (%v): the shared test data comes with the project's workspace, not this repository", dir, err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// Repo returns the repository's top directory.
func Repo(t testing.TB) string {
	t.Helper()
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("cannot locate the repository")
	}
	abs, err := filepath.Abs(filepath.Join(filepath.Dir(file), "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// Render plans a machine and writes it into a new temporary overlay root.
func Render(t testing.TB, m *profile.Machine, opts plan.Options) (string, *plan.Plan) {
	t.Helper()
	p, err := plan.New(m, opts)
	if err != nil {
		t.Fatalf("plan %s: %v", m.Source, err)
	}
	root := t.TempDir()
	if _, err := writer.Apply(root, p, writer.Options{}); err != nil {
		t.Fatalf("render %s: %v", m.Source, err)
	}
	return root, p
}
