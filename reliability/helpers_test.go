package reliability

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoRoot is the module root: this package sits directly under it, and go
// test runs in the package directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	wd, err := os.Getwd()
	require.NoError(t, err)
	return filepath.Dir(wd)
}

// buildBinary builds the real nvml-mock-sysfs, as make build does, into a
// temporary directory. The build cache makes repeated builds cheap.
func buildBinary(t testing.TB) string {
	t.Helper()
	// go test puts its own GOROOT/bin first on the PATH of tests.
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("the go tool is not on PATH, so the real binary cannot be built: " + err.Error())
	}
	bin := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	cmd := exec.Command(goTool, "build", "-trimpath", "-o", bin, "./cmd/nvml-mock-sysfs")
	cmd.Dir = repoRoot(t)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func requireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
}

// result is one run of the binary.
type result struct {
	code   int
	stdout string
	stderr string
}

func runBinary(t testing.TB, bin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "run %s %v: %v", bin, args, err)
		code = ee.ExitCode()
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// render runs the binary's render and requires success.
func render(t testing.TB, bin, root, profile string, extra ...string) {
	t.Helper()
	args := append([]string{"render", "--root", root, "--profile", profile}, extra...)
	r := runBinary(t, bin, args...)
	require.Equal(t, 0, r.code, "render %s into %s: %s", profile, root, r.stderr)
}

// snapshotOptions choose what a snapshot records beyond content.
type snapshotOptions struct {
	// identity adds inode numbers and modification times, so that two
	// snapshots are equal only if nothing was rewritten at all.
	identity bool
}

// snapshot records a whole tree without following links: for every path
// (the root itself included) its type, permission and special bits, owner,
// link count, and its content's digest or its link text. Nothing is
// excluded: the writer's own state directory is compared too.
func snapshot(t testing.TB, root string, opts snapshotOptions) map[string]string {
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
		if opts.identity {
			desc += fmt.Sprintf(" ino=%d mtime=%d.%09d", st.Ino, st.Mtim.Sec, st.Mtim.Nsec)
		}
		out[rel] = desc
		return nil
	})
	require.NoError(t, err)
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

// diffSnapshots lists every path that differs, for a readable failure.
func diffSnapshots(want, got map[string]string) []string {
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

// requireSameTree fails with the first differences between two snapshots.
func requireSameTree(t testing.TB, want, got map[string]string, what string) {
	t.Helper()
	diffs := diffSnapshots(want, got)
	if len(diffs) > 20 {
		diffs = append(diffs[:20], fmt.Sprintf("... and %d more", len(diffs)-20))
	}
	require.Empty(t, diffs, "%s:\n%s", what, strings.Join(diffs, "\n"))
}
