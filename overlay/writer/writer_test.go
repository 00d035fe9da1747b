package writer_test

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

func TestMain(m *testing.M) { os.Exit(overlaytest.Main(m)) }

func planOf(t *testing.T, name string, edit func(*profile.Profile)) *plan.Plan {
	t.Helper()
	p, src, err := shipped.Load(name)
	require.NoError(t, err)
	if edit != nil {
		edit(p)
	}
	m, err := profile.Normalize(src, p, profile.Options{})
	require.NoError(t, err)
	pl, err := plan.New(m, plan.Options{})
	require.NoError(t, err)
	return pl
}

// apply renders without syncfs: these tests are not of durability.
func apply(t *testing.T, root string, p *plan.Plan) writer.Stats {
	t.Helper()
	st, err := writer.Apply(root, p, writer.Options{SkipSync: true})
	require.NoError(t, err)
	return st
}

func TestApplyWritesThePlan(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	p := planOf(t, "hgx-h100", nil)
	// This render syncs, as the product's always do; the other tests skip
	// syncfs, which flushes the whole filesystem and tests no more here.
	st, err := writer.Apply(root, p, writer.Options{})
	require.NoError(t, err)
	var files, links int
	for _, e := range p.Entries {
		full := filepath.Join(root, e.Path)
		info, err := os.Lstat(full)
		require.NoError(t, err, e.Path)
		switch e.Kind {
		case plan.Dir:
			require.True(t, info.IsDir(), e.Path)
			require.Equal(t, os.FileMode(0o755), info.Mode().Perm(), e.Path)
		case plan.File:
			files++
			data, err := os.ReadFile(full)
			require.NoError(t, err)
			require.Equal(t, e.Data, data, e.Path)
			require.Equal(t, os.FileMode(0o644), info.Mode().Perm(), e.Path)
		case plan.Symlink:
			links++
			target, err := os.Readlink(full)
			require.NoError(t, err)
			require.Equal(t, e.Target, target, e.Path)
		}
	}
	require.Equal(t, files, st.FilesWritten)
	require.Equal(t, links, st.LinksWritten)
	require.Zero(t, st.FilesUnchanged)

	// Every entry of the links directory resolves, through the loop link,
	// to its device's directory.
	entries, err := os.ReadDir(filepath.Join(root, plan.LinksDir))
	require.NoError(t, err)
	require.Len(t, entries, len(p.Tree.Nodes()))
	for _, e := range entries {
		vendor, err := os.ReadFile(filepath.Join(root, plan.LinksDir, e.Name(), "vendor"))
		require.NoError(t, err, e.Name())
		require.Contains(t, []string{"0x10de\n", "0x8086\n", "0x1000\n", "0x15b3\n"}, string(vendor))
		real, err := filepath.EvalSymlinks(filepath.Join(root, plan.LinksDir, e.Name()))
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(real, root+"/sys/devices/pci"), real)
		require.Equal(t, e.Name(), filepath.Base(real))
	}

	fsys := os.DirFS(root)
	m, err := writer.ReadMarker(fsys)
	require.NoError(t, err)
	require.Equal(t, writer.Marker{Digest: p.Digest(), Entries: len(p.Entries), GPUs: 8, ContainerRoot: plan.DefaultContainerRoot}, m)
	_, err = os.Stat(filepath.Join(root, ".nvml-mock-sysfs", "staging"))
	require.ErrorIs(t, err, os.ErrNotExist, "staging is gone after a render")
}

// A first render into a directory that already holds files where the plan
// puts its own refuses, naming them, and changes nothing; Force replaces
// them. Once a render made the tree (its manifest), re-renders never ask.
func TestFirstRenderRefusesForeignFiles(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, plan.ProfileFile), []byte("mine\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "notes.txt"), []byte("mine\n"), 0o644))
	before := overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true})
	p := planOf(t, "t4-vm", nil)
	_, err := writer.Apply(root, p, writer.Options{SkipSync: true})
	require.ErrorContains(t, err, root+" holds no render (no .nvml-mock-sysfs/manifest) but already has "+plan.ProfileFile+" where a render writes")
	require.ErrorContains(t, err, "--force replaces them")
	require.NotContains(t, err.Error(), "notes.txt", "files the plan does not touch are not in the way")
	require.NotContains(t, err.Error(), "sys,", "directories are shared, not replaced")
	overlaytest.RequireSameTree(t, before, overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{Identity: true}), "a refused render")

	_, err = writer.Apply(root, p, writer.Options{Force: true, SkipSync: true})
	require.NoError(t, err)
	_, err = writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{SkipSync: true})
	require.NoError(t, err, "a rendered root re-renders without --force")
}

func TestApplyIsDeterministic(t *testing.T) {
	t.Parallel()
	a, b := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	apply(t, a, planOf(t, "dgx-a100", nil))
	apply(t, b, planOf(t, "dgx-a100", nil))
	overlaytest.RequireSameTree(t, overlaytest.Snapshot(t, a, overlaytest.SnapshotOptions{}), overlaytest.Snapshot(t, b, overlaytest.SnapshotOptions{}), "two renders of one profile")
}

func TestRerenderUnchangedWritesNothing(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	first := apply(t, root, planOf(t, "dgx-a100", nil))
	again := apply(t, root, planOf(t, "dgx-a100", nil))
	require.Zero(t, again.Written())
	require.Zero(t, again.DirsCreated)
	require.Zero(t, again.Removed)
	require.Equal(t, first.FilesWritten, again.FilesUnchanged)
	require.Equal(t, first.LinksWritten, again.LinksUnchanged)

	// With the marker gone, the same render compares content and only
	// writes the marker back.
	require.NoError(t, os.Remove(filepath.Join(root, writer.MarkerFile)))
	st := apply(t, root, planOf(t, "dgx-a100", nil))
	require.Zero(t, st.Written())
	_, err := writer.ReadMarker(os.DirFS(root))
	require.NoError(t, err)
}

func TestOneGPUChangeRewritesOnlyIt(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	apply(t, root, planOf(t, "hgx-h100", nil))
	st := apply(t, root, planOf(t, "hgx-h100", func(p *profile.Profile) {
		p.Devices[3].PCI.SubsystemID = profile.Pack(0x10de, 0x1234)
	}))
	// The GPU's subsystem_device, config, modalias and uevent, plus the
	// effective profile.
	require.Equal(t, 5, st.FilesWritten)
	require.Zero(t, st.LinksWritten)
	require.Zero(t, st.Removed)
	data, err := os.ReadFile(filepath.Join(root, plan.LinksDir, "0000:86:00.0", "subsystem_device"))
	require.NoError(t, err)
	require.Equal(t, "0x1234\n", string(data))
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	info, err := os.Stat(p)
	require.NoError(t, err)
	return info.Sys().(*syscall.Stat_t).Ino
}

func TestRerenderReplacesTreeInPlace(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	apply(t, root, planOf(t, "dgx-a100", nil))
	rootIno, linksIno := inode(t, root), inode(t, filepath.Join(root, plan.LinksDir))

	h100 := planOf(t, "hgx-h100", nil)
	st := apply(t, root, h100)
	require.NotZero(t, st.Removed)
	require.Equal(t, rootIno, inode(t, root), "the overlay mount source stays the same directory")
	require.Equal(t, linksIno, inode(t, filepath.Join(root, plan.LinksDir)), "the links mount source stays the same directory")

	// Exactly the new tree: equal to a fresh render of it.
	fresh := filepath.Join(t.TempDir(), "fresh")
	apply(t, fresh, h100)
	overlaytest.RequireSameTree(t, overlaytest.Snapshot(t, fresh, overlaytest.SnapshotOptions{}), overlaytest.Snapshot(t, root, overlaytest.SnapshotOptions{}), "re-render against a fresh render")
}

func TestForeignEntriesAreKeptAndReported(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	apply(t, root, planOf(t, "t4-vm", nil))
	require.NoError(t, os.WriteFile(filepath.Join(root, "notes.txt"), []byte("mine"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(root, plan.LinksDir, "README"), []byte("stray"), 0o644))
	st := apply(t, root, planOf(t, "hgx-h100", nil))
	require.Equal(t, []string{"README"}, st.Foreign)
	data, err := os.ReadFile(filepath.Join(root, "notes.txt"))
	require.NoError(t, err)
	require.Equal(t, "mine", string(data), "prune removes only what a render owns")
}

func TestCheckRoot(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"", "relative/dir", "/", "/var/lib/nvml-mock/", "/var/../lib"} {
		_, err := writer.Apply(bad, planOf(t, "t4-vm", nil), writer.Options{SkipSync: true})
		require.Error(t, err, bad)
	}
}

// The installed binary is planned by reference: it is read only to copy or
// to compare byte for byte, and its fingerprint stands for its content.
func TestSourceFiles(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	src := filepath.Join(t.TempDir(), "nvml-mock-sysfs")
	require.NoError(t, os.WriteFile(src, []byte("version one"), 0o755))
	withBinary := func(fingerprint string) *plan.Plan {
		p := planOf(t, "t4-vm", nil)
		p.Entries = append([]plan.Entry{
			{Path: "bin", Kind: plan.Dir, Mode: 0o755},
			{Path: plan.BinaryFile, Kind: plan.File, Mode: 0o755, Source: &plan.FileSource{Path: src, Size: 11, Fingerprint: fingerprint}},
		}, p.Entries...)
		return p
	}
	installed := func() string {
		b, err := os.ReadFile(filepath.Join(root, plan.BinaryFile))
		require.NoError(t, err)
		return string(b)
	}
	st := apply(t, root, withBinary("one"))
	require.Equal(t, "version one", installed())
	require.Equal(t, sumData(planOf(t, "t4-vm", nil))+11, st.BytesWritten, "the binary counts by its size")

	require.Zero(t, apply(t, root, withBinary("one")).Written(), "same fingerprint, same size: nothing to write")

	// A new build of the same size: the fingerprint changes, so it is copied.
	require.NoError(t, os.WriteFile(src, []byte("version two"), 0o755))
	st = apply(t, root, withBinary("two"))
	require.Equal(t, 1, st.FilesWritten)
	require.Equal(t, "version two", installed())

	// Byte-for-byte comparison catches what a fingerprint cannot.
	require.NoError(t, os.WriteFile(src, []byte("version 3!!"), 0o755))
	st, err := writer.Apply(root, withBinary("two"), writer.Options{CompareContent: true, SkipSync: true})
	require.NoError(t, err)
	require.Equal(t, 1, st.FilesWritten)
	require.Equal(t, "version 3!!", installed())
}

func sumData(p *plan.Plan) int64 {
	var n int64
	for _, e := range p.Entries {
		n += e.Len()
	}
	return n
}

// TestHoldsSkipsWhatTheHeldPlanVouchesFor: with the plan the root holds,
// vouched for by its marker, only the entries that differ from it are
// compared; a held plan the marker does not vouch for is ignored, and the
// whole tree is compared as without one.
func TestHoldsSkipsWhatTheHeldPlanVouchesFor(t *testing.T) {
	t.Parallel()
	root := filepath.Join(t.TempDir(), "overlay")
	held := planOf(t, "hgx-h100", nil)
	apply(t, root, held)
	// A file changed behind the writer's back, keeping its size: only a
	// byte-for-byte comparison finds it.
	vendor := filepath.Join(root, "sys/devices/pci0000:50/0000:50:01.0/0000:51:00.0/0000:52:00.0/0000:53:00.0/vendor")
	require.NoError(t, os.WriteFile(vendor, []byte("0xffff\n"), 0o644))
	next := planOf(t, "hgx-h100", func(p *profile.Profile) { p.Devices[3].PCI.SubsystemID = profile.Pack(0x10de, 0x1234) })

	st, err := writer.Apply(root, next, writer.Options{SkipSync: true, Holds: held})
	require.NoError(t, err)
	require.Equal(t, 5, st.FilesWritten, "the changed GPU's four files and the effective profile")
	got, err := os.ReadFile(vendor)
	require.NoError(t, err)
	require.Equal(t, "0xffff\n", string(got), "trusted: the held plan vouched for it")

	// The marker now vouches for next, not held: held is ignored.
	st, err = writer.Apply(root, planOf(t, "hgx-h100", nil), writer.Options{SkipSync: true, Holds: held})
	require.NoError(t, err)
	got, err = os.ReadFile(vendor)
	require.NoError(t, err)
	require.Equal(t, "0x10de\n", string(got), "compared, and mended")
	require.Equal(t, 6, st.FilesWritten)
}
