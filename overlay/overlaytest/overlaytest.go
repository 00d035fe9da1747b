// Package overlaytest holds helpers for tests of rendered trees: snapshots
// to compare trees byte for byte, and the location of the project's shared
// test data.
package overlaytest

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// SnapshotOptions choose what a snapshot records beyond content.
type SnapshotOptions struct {
	// Identity adds inode numbers and modification times, so that two
	// snapshots are equal only if nothing was rewritten at all.
	Identity bool
}

// Snapshot records a whole tree without following links: for every path
// (the root itself included) its type, permission and special bits, owner,
// link count, and its content's digest or its link text. Nothing is
// excluded: the writer's own state directory is compared too.
func Snapshot(t testing.TB, root string, opts SnapshotOptions) map[string]string {
	t.Helper()
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
		st := info.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%s mode=%v uid=%d gid=%d nlink=%d", typeName(info.Mode()), info.Mode(), st.Uid, st.Gid, st.Nlink)
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" size=%d sha256=%x", len(data), sha256.Sum256(data))
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		if opts.Identity {
			desc += fmt.Sprintf(" ino=%d mtime=%d.%09d", st.Ino, st.Mtim.Sec, st.Mtim.Nsec)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("snapshot %s: %v", root, err)
	}
	return out
}

func typeName(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "dir"
	case m.IsRegular():
		return "file"
	case m&fs.ModeSymlink != 0:
		return "symlink"
	}
	return "special(" + m.Type().String() + ")"
}

// DiffSnapshots lists every path that differs, for a readable failure.
func DiffSnapshots(want, got map[string]string) []string {
	var diffs []string
	for p, w := range want {
		g, ok := got[p]
		switch {
		case !ok:
			diffs = append(diffs, "missing "+p+": "+w)
		case g != w:
			diffs = append(diffs, "changed "+p+": want "+w+", got "+g)
		}
	}
	for p, g := range got {
		if _, ok := want[p]; !ok {
			diffs = append(diffs, "extra "+p+": "+g)
		}
	}
	slices.Sort(diffs)
	return diffs
}

// RequireSameTree fails with the first differences between two snapshots.
func RequireSameTree(t testing.TB, want, got map[string]string, what string) {
	t.Helper()
	diffs := DiffSnapshots(want, got)
	if len(diffs) > 20 {
		diffs = append(diffs[:20], fmt.Sprintf("... and %d more", len(diffs)-20))
	}
	if len(diffs) > 0 {
		t.Fatalf("%s:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// SharedTestdata returns the absolute path of ../shared/testdata/<sub>
// beside the repository, or stops the test (Missing), saying why, when it
// is absent.
func SharedTestdata(t testing.TB, sub string) string {
	t.Helper()
	return Shared(t, filepath.Join("testdata", sub))
}

// Shared returns the absolute path of ../shared/<sub> beside the
// repository, or stops the test (Missing), saying why, when it is absent.
func Shared(t testing.TB, sub string) string {
	t.Helper()
	dir := filepath.Join(Repo(t), "..", "shared", sub)
	if _, err := os.Stat(dir); err != nil {
		Missing(t, "%s is absent (%v): the shared data comes with the project's workspace, not this repository", dir, err)
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

// RepoProfiles lists the repository's own profiles, testdata/profiles/*.yaml:
// the shapes every suite renders beside the built-ins.
func RepoProfiles(t testing.TB) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(Repo(t), "testdata", "profiles", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no profiles in testdata/profiles: %v", err)
	}
	return files
}

// Render plans a machine and writes it into a new temporary overlay root.
func Render(t testing.TB, m *profile.Machine, opts plan.Options) (string, *plan.Plan) {
	t.Helper()
	p, err := plan.New(m, opts)
	if err != nil {
		t.Fatalf("plan %s: %v", m.Source, err)
	}
	root := t.TempDir()
	if _, err := writer.Apply(root, p, writer.Options{SkipSync: true}); err != nil {
		t.Fatalf("render %s: %v", m.Source, err)
	}
	return root, p
}
