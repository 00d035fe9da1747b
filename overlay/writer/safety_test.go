package writer_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

func builtinPlan(t *testing.T, name string) *plan.Plan {
	t.Helper()
	p, ok := shipped.Get(name)
	require.True(t, ok, name)
	m, err := profile.Normalize("built-in "+name, p, profile.Options{})
	require.NoError(t, err)
	pl, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	return pl
}

// rendered returns a root holding a fresh render of the t4 plan, and a
// directory outside it that a planted link may point at.
func rendered(t *testing.T) (root, outside string) {
	t.Helper()
	dir := t.TempDir()
	root, outside = filepath.Join(dir, "root"), filepath.Join(dir, "outside")
	require.NoError(t, os.Mkdir(outside, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "precious"), []byte("keep me\n"), 0o600))
	_, err := writer.Apply(root, builtinPlan(t, "t4-vm"), writer.Options{SkipSync: true})
	require.NoError(t, err)
	return root, outside
}

// digestTree records a tree (without following links) to show it unchanged.
func digestTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		desc := info.Mode().String()
		switch {
		case info.Mode().IsRegular():
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(data))
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[p] = desc
		return nil
	}))
	return out
}

// plantLink replaces what is at rel inside root by a symlink to target.
func plantLink(t *testing.T, root, rel, target string) {
	t.Helper()
	p := filepath.Join(root, rel)
	require.NoError(t, os.RemoveAll(p))
	require.NoError(t, os.Symlink(target, p))
}

const gpuDir = "sys/devices/pci0000:00/0000:00:1e.0"

// TestApplyRefusesPlantedSymlinks plants symlinks inside a rendered root
// where the plan has a directory or a file, and expects the render to
// refuse, naming the path, and to write nothing outside the root.
func TestApplyRefusesPlantedSymlinks(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		plant func(t *testing.T, root, outside string)
		want  string
	}{
		{"sys/devices leads out", func(t *testing.T, root, outside string) {
			plantLink(t, root, "sys/devices", outside)
		}, "sys/devices"},
		{"a device directory leads out", func(t *testing.T, root, outside string) {
			plantLink(t, root, gpuDir, outside)
		}, gpuDir},
		{"a device file leads to a file outside", func(t *testing.T, root, outside string) {
			plantLink(t, root, gpuDir+"/vendor", filepath.Join(outside, "precious"))
		}, gpuDir + "/vendor"},
		{"the state directory leads out", func(t *testing.T, root, outside string) {
			plantLink(t, root, writer.StateDir, outside)
		}, writer.StateDir},
		{"the manifest leads to a file outside", func(t *testing.T, root, outside string) {
			plantLink(t, root, writer.ManifestFile, filepath.Join(outside, "precious"))
		}, writer.ManifestFile},
		{"opt, holding the loop link, leads out", func(t *testing.T, root, outside string) {
			plantLink(t, root, "opt", outside)
		}, "opt"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := rendered(t)
			tc.plant(t, root, outside)
			before := digestTree(t, outside)
			for _, opts := range []writer.Options{{}, {CompareContent: true}} {
				_, err := writer.Apply(root, builtinPlan(t, "t4-vm"), opts)
				require.Error(t, err)
				require.Contains(t, err.Error(), filepath.Join(root, tc.want))
				require.NotContains(t, err.Error(), "\n")
				require.Equal(t, before, digestTree(t, outside), "something was written outside the root")
			}
		})
	}
}

// TestApplyReplacesPlantedLinksWithoutFollowing plants symlinks where the
// render replaces an entry anyway: it must replace the link itself.
func TestApplyReplacesPlantedLinksWithoutFollowing(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		plant func(t *testing.T, root, outside string)
		check func(t *testing.T, root string)
	}{
		{"a links-directory entry leads to a file outside", func(t *testing.T, root, outside string) {
			plantLink(t, root, plan.LinksDir+"/0000:00:1e.0", filepath.Join(outside, "precious"))
		}, func(t *testing.T, root string) {
			target, err := os.Readlink(filepath.Join(root, plan.LinksDir, "0000:00:1e.0"))
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(target, "0000:"), target)
		}},
		{"the staging directory leads out", func(t *testing.T, root, outside string) {
			plantLink(t, root, writer.StateDir+"/staging", outside)
		}, func(t *testing.T, root string) {
			_, err := os.Lstat(filepath.Join(root, writer.StateDir, "staging"))
			require.ErrorIs(t, err, fs.ErrNotExist)
		}},
		{"the marker leads to a file outside", func(t *testing.T, root, outside string) {
			plantLink(t, root, writer.MarkerFile, filepath.Join(outside, "precious"))
		}, func(t *testing.T, root string) {
			info, err := os.Lstat(filepath.Join(root, writer.MarkerFile))
			require.NoError(t, err)
			require.True(t, info.Mode().IsRegular())
		}},
		{"a device file is a hard link of a file outside", func(t *testing.T, root, outside string) {
			p := filepath.Join(root, gpuDir, "vendor")
			require.NoError(t, os.Remove(p))
			require.NoError(t, os.Link(filepath.Join(outside, "precious"), p))
		}, func(t *testing.T, root string) {
			info, err := os.Lstat(filepath.Join(root, gpuDir, "vendor"))
			require.NoError(t, err)
			require.Equal(t, uint64(1), uint64(info.Sys().(*syscall.Stat_t).Nlink))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := rendered(t)
			tc.plant(t, root, outside)
			before := digestTree(t, outside)
			// gb200 changes the tree, so the render passes through staging.
			for _, p := range []*plan.Plan{builtinPlan(t, "gb200-tray"), builtinPlan(t, "t4-vm")} {
				_, err := writer.Apply(root, p, writer.Options{SkipSync: true})
				require.NoError(t, err)
				require.Equal(t, before, digestTree(t, outside), "something was written outside the root")
			}
			tc.check(t, root)
			requireTreeIs(t, root, builtinPlan(t, "t4-vm"))
		})
	}
}

// TestApplyRefusesSpecialFiles plants a FIFO and a device node where the
// plan has files: the render refuses and never opens them, so a FIFO
// cannot block it with the lock held.
func TestApplyRefusesSpecialFiles(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		rel  string
		mode uint32
		dev  int
		want string // "" means the render replaces it
	}{
		{"FIFO as a device file", gpuDir + "/class", unix.S_IFIFO | 0o644, 0, "special file"},
		{"character device as a device file", gpuDir + "/config", unix.S_IFCHR | 0o644, int(unix.Mkdev(1, 3)), "special file"},
		{"FIFO as the manifest", writer.ManifestFile, unix.S_IFIFO | 0o644, 0, "not a regular file"},
		{"FIFO as the marker", writer.MarkerFile, unix.S_IFIFO | 0o644, 0, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.mode&unix.S_IFMT == unix.S_IFCHR && os.Geteuid() != 0 {
				overlaytest.Missing(t, "making a device node needs root")
			}
			root, _ := rendered(t)
			p := filepath.Join(root, tc.rel)
			require.NoError(t, os.Remove(p))
			require.NoError(t, unix.Mknod(p, tc.mode, tc.dev))
			_, err := writer.Apply(root, builtinPlan(t, "t4-vm"), writer.Options{SkipSync: true})
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)
				require.ErrorContains(t, err, p)
				return
			}
			require.NoError(t, err)
			requireTreeIs(t, root, builtinPlan(t, "t4-vm"))
		})
	}
}

// TestApplyModes renders under umask 077 and plants a set-uid bit: files
// must end up 0644, directories 0755, and nothing special anywhere.
func TestApplyModes(t *testing.T) {
	// Not parallel: the umask is the whole process's. Go runs the parallel
	// tests only after every serial one has ended.
	old := unix.Umask(0o077)
	defer unix.Umask(old)
	root := filepath.Join(t.TempDir(), "root")
	p := builtinPlan(t, "hgx-h100")
	_, err := writer.Apply(root, p, writer.Options{SkipSync: true})
	require.NoError(t, err)
	requireModes(t, root)

	victim := filepath.Join(root, "sys/devices/pci0000:50/0000:50:01.0/0000:51:00.0/0000:52:00.0/0000:53:00.0/config")
	require.NoError(t, unix.Chmod(victim, 0o4755))
	st, err := writer.Apply(root, p, writer.Options{SkipSync: true})
	require.NoError(t, err)
	require.Equal(t, 1, st.FilesWritten)
	requireModes(t, root)
}

func requireModes(t *testing.T, root string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		require.NoError(t, unix.Lstat(p, &st))
		perm := st.Mode & 0o7777
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			require.Equal(t, uint32(0o755), perm, p)
		case unix.S_IFREG:
			require.Equal(t, uint32(0o644), perm, p)
		case unix.S_IFLNK:
		default:
			t.Errorf("%s is special (mode %#o)", p, st.Mode)
		}
		return nil
	}))
}

// TestPruneKeepsForeignFiles puts files no render made into the root, into
// a device directory that a later render drops, and into the links
// directory: prune removes only what renders own.
func TestPruneKeepsForeignFiles(t *testing.T) {
	t.Parallel()
	root, _ := rendered(t)
	foreign := map[string]string{
		"notes.txt":                   "mine\n",
		gpuDir + "/notes.txt":         "mine too\n",
		plan.LinksDir + "/README.txt": "not a device\n",
	}
	for rel, data := range foreign {
		require.NoError(t, os.WriteFile(filepath.Join(root, rel), []byte(data), 0o600))
	}
	st, err := writer.Apply(root, builtinPlan(t, "gb200-tray"), writer.Options{SkipSync: true})
	require.NoError(t, err)
	for rel, data := range foreign {
		got, err := os.ReadFile(filepath.Join(root, rel))
		require.NoError(t, err, rel)
		require.Equal(t, data, string(got))
	}
	require.Contains(t, st.Kept, gpuDir)
	require.Equal(t, []string{"README.txt"}, st.Foreign)
	require.Positive(t, st.Removed)
}

// TestApplyRefusesHostileManifest edits the manifest so that prune would
// reach outside the root or through a planted link.
func TestApplyRefusesHostileManifest(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		line string
		want string
	}{
		{"parent directory", "f ../outside/precious", "bad line"},
		{"absolute path", "f /etc/passwd", "bad line"},
		{"dot dot inside", "f sys/../../outside/precious", "bad line"},
		{"the state directory", "d " + writer.StateDir, "bad line"},
		{"unknown kind", "x sys", "bad line"},
		{"through a planted link", "f sys/evil/precious", "sys/evil"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			root, outside := rendered(t)
			require.NoError(t, os.Symlink(outside, filepath.Join(root, "sys/evil")))
			mf := filepath.Join(root, writer.ManifestFile)
			data, err := os.ReadFile(mf)
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(mf, append(data, []byte(tc.line+"\n")...), 0o644))
			before := digestTree(t, outside)
			// gb200 drops the t4 entries, so prune runs.
			_, err = writer.Apply(root, builtinPlan(t, "gb200-tray"), writer.Options{SkipSync: true})
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, before, digestTree(t, outside))
		})
	}
}

// TestLockSerialisesRenders holds the root's lock as another render would:
// a render gives up with a clear error and changes nothing; renders from
// many goroutines at once all succeed and leave one complete tree.
func TestLockSerialisesRenders(t *testing.T) {
	t.Parallel()
	root, _ := rendered(t)
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	require.NoError(t, err)
	require.NoError(t, unix.Flock(fd, unix.LOCK_EX))
	before := digestTree(t, root)
	_, err = writer.Apply(root, builtinPlan(t, "gb200-tray"), writer.Options{LockTimeout: 100 * time.Millisecond, SkipSync: true})
	require.ErrorContains(t, err, "another render holds the lock on "+root)
	require.Equal(t, before, digestTree(t, root))
	require.NoError(t, unix.Close(fd))

	plans := []*plan.Plan{builtinPlan(t, "t4-vm"), builtinPlan(t, "gb200-tray")}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = writer.Apply(root, plans[i%2], writer.Options{SkipSync: true})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	m, err := writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err)
	for _, p := range plans {
		if p.Digest() == m.Digest {
			requireTreeIs(t, root, p)
			return
		}
	}
	t.Fatalf("the marker names neither plan: %+v", m)
}

// TestLeftoverStagingGoes leaves the empty staging directory a render
// killed after its marker leaves; the next render, with nothing else to
// do, removes it.
func TestLeftoverStagingGoes(t *testing.T) {
	t.Parallel()
	root, _ := rendered(t)
	require.NoError(t, os.Mkdir(filepath.Join(root, writer.StateDir, "staging"), 0o700))
	st, err := writer.Apply(root, builtinPlan(t, "t4-vm"), writer.Options{SkipSync: true})
	require.NoError(t, err)
	require.Zero(t, st.Written())
	requireTreeIs(t, root, builtinPlan(t, "t4-vm"))
}

// requireTreeIs checks that root holds exactly the plan, and the state of a
// finished render: the manifest, the marker, no staging directory.
func requireTreeIs(t *testing.T, root string, p *plan.Plan) {
	t.Helper()
	want := map[string]string{}
	var manifest bytes.Buffer
	for _, e := range p.Entries {
		want[e.Path] = describeEntry(e.Kind, e.Mode, e.Data, e.Target)
		fmt.Fprintf(&manifest, "%s %s\n", [...]string{"d", "f", "l"}[e.Kind], e.Path)
	}
	got := map[string]string{}
	require.NoError(t, filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil || rel == "." {
			return err
		}
		if rel == writer.StateDir {
			return fs.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		var data []byte
		var target string
		kind := plan.Dir
		switch {
		case info.Mode().IsRegular():
			kind = plan.File
			if data, err = os.ReadFile(path); err != nil {
				return err
			}
		case info.Mode()&fs.ModeSymlink != 0:
			kind = plan.Symlink
			if target, err = os.Readlink(path); err != nil {
				return err
			}
		case !info.IsDir():
			return fmt.Errorf("%s is special", path)
		}
		mode := info.Mode().Perm()
		if kind == plan.Symlink {
			mode = 0
		}
		got[rel] = describeEntry(kind, mode, data, target)
		return nil
	}))
	require.Equal(t, want, got)
	state, err := os.ReadDir(filepath.Join(root, writer.StateDir))
	require.NoError(t, err)
	var names []string
	for _, s := range state {
		names = append(names, s.Name())
	}
	require.Equal(t, []string{"complete", "manifest"}, names)
	data, err := os.ReadFile(filepath.Join(root, writer.ManifestFile))
	require.NoError(t, err)
	require.Equal(t, manifest.String(), string(data))
	m, err := writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err)
	require.Equal(t, p.Digest(), m.Digest)
}

func describeEntry(kind plan.EntryKind, mode fs.FileMode, data []byte, target string) string {
	return fmt.Sprintf("%s %v %x -> %s", kind, mode.Perm(), sha256.Sum256(data), target)
}
