package fusetree

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// fakeController stands for the renderer: "ctl", "ctl2" and "ctl3" take
// writes. Writing "x" replaces file "a" with longer content, re-points link
// "l", adds directory "d2", removes "d1" and records the write in "ctl", each
// as the renderer does it (rename over, or remove); "bad" fails with ENODEV;
// anything else is only recorded.
type fakeController struct {
	// root is where the backing tree is written; a func so a test can
	// point it at Server.BackingPath after Mount.
	root func() string
	// silent withholds the changed paths, to show what the caches keep.
	silent bool
	// delay is how long each Write takes.
	delay time.Duration

	inflight, maxInflight atomic.Int32
	mu                    sync.Mutex
	calls                 []string // rel + " " + data
}

func (c *fakeController) Writable(rel string) bool {
	return rel == "ctl" || rel == "ctl2" || rel == "ctl3"
}

func (c *fakeController) Write(rel string, data []byte) ([]string, syscall.Errno) {
	if n := c.inflight.Add(1); n > c.maxInflight.Load() {
		c.maxInflight.Store(n)
	}
	defer c.inflight.Add(-1)
	time.Sleep(c.delay)
	c.mu.Lock()
	c.calls = append(c.calls, rel+" "+string(data))
	c.mu.Unlock()

	switch strings.TrimSpace(string(data)) {
	case "bad":
		return nil, syscall.ENODEV
	case "x":
		root := c.root()
		must(replaceFile(filepath.Join(root, "a"), "a much longer content than before\n"))
		must(replaceLink(filepath.Join(root, "l"), "target-two-is-longer"))
		must(os.Mkdir(filepath.Join(root, "d2"), 0o755))
		must(os.WriteFile(filepath.Join(root, "d2", "g"), []byte("g\n"), 0o444))
		must(os.RemoveAll(filepath.Join(root, "d1")))
		must(replaceFile(filepath.Join(root, rel), string(data)))
		if c.silent {
			return nil, 0
		}
		return []string{"a", "l", "d2", "d1", rel}, 0
	}
	return nil, 0
}

func (c *fakeController) Calls() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

func must(err error) {
	if err != nil {
		panic(err)
	}
}

// replaceFile and replaceLink change the tree as the renderer does: the new
// version is made beside the old and renamed over it.
func replaceFile(name, content string) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

func replaceLink(name, target string) error {
	tmp := name + ".tmp"
	if err := os.Symlink(target, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// smallTree writes the tree the tests serve: files of several modes, an
// empty one, control files, symlinks (relative, absolute, dangling, to a
// directory), nested and empty directories.
func smallTree(t testing.TB, dir string) {
	t.Helper()
	files := []struct {
		name, content string
		mode          os.FileMode
	}{
		{"a", "short", 0o444},
		{"ctl", "idle\n", 0o200},
		{"ctl2", "", 0o644},
		{"ctl3", "", 0o644},
		{"d1/f", "f\n", 0o644},
		{"sys/bus/pci/devices/0000:01:00.0/vendor", "0x10de\n", 0o444},
		{"sys/bus/pci/devices/0000:01:00.0/config", strings.Repeat("\x00\xff", 2048), 0o644},
		{"sys/bus/pci/devices/0000:01:00.0/empty", "", 0o444},
		{"sys/bus/pci/drivers/nvidia/new_id", "", 0o200},
	}
	for _, f := range files {
		p := filepath.Join(dir, f.name)
		must(os.MkdirAll(filepath.Dir(p), 0o755))
		must(os.WriteFile(p, []byte(f.content), f.mode))
		must(os.Chmod(p, f.mode))
	}
	links := map[string]string{
		"l": "target-one",
		"sys/bus/pci/devices/0000:01:00.0/driver": "../../drivers/nvidia",
		"sys/bus/pci/drivers/nvidia/0000:01:00.0": "../../devices/0000:01:00.0",
		"sys/abs":     "/sys/bus/pci",
		"sys/dangles": "nowhere",
	}
	for name, target := range links {
		must(os.Symlink(target, filepath.Join(dir, name)))
	}
	must(os.MkdirAll(filepath.Join(dir, "sys/empty"), 0o555))
}

// manifest describes every entry under dir: type and mode, size, owner,
// link count, inode, mtime, and the content or link text.
func manifest(t testing.TB, dir string) map[string]string {
	t.Helper()
	m := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		desc := fmt.Sprintf("mode=%o size=%d uid=%d gid=%d nlink=%d ino=%d mtime=%d.%09d",
			st.Mode, st.Size, st.Uid, st.Gid, st.Nlink, st.Ino, st.Mtim.Sec, st.Mtim.Nsec)
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		case unix.S_IFREG:
			data, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %q", data)
		case unix.S_IFDIR:
			names, err := os.ReadDir(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %d entries", len(names))
		}
		m[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatalf("walk %s: %v", dir, err)
	}
	return m
}

func sameManifest(t testing.TB, what string, got, want map[string]string) {
	t.Helper()
	for rel, w := range want {
		if g, ok := got[rel]; !ok {
			t.Errorf("%s: %s missing", what, rel)
		} else if g != w {
			t.Errorf("%s: %s:\n got %s\nwant %s", what, rel, g, w)
		}
	}
	for rel := range got {
		if _, ok := want[rel]; !ok {
			t.Errorf("%s: %s should not be there", what, rel)
		}
	}
}

// mount mounts opts and unmounts at the end of the test, failing it if the
// mount is left behind.
func mount(t testing.TB, opts Options) *Server {
	t.Helper()
	srv, err := Mount(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Unmount(); err != nil {
			t.Error(err)
			// Do not leave it for the next test to trip over.
			unix.Unmount(srv.MountPoint(), unix.MNT_DETACH)
		}
		srv.Wait()
		if live, err := IsFUSEMount(srv.MountPoint()); err != nil || live {
			t.Errorf("%s still mounted after Unmount (%v)", srv.MountPoint(), err)
		}
	})
	return srv
}

func errnoOf(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno
	}
	return 0
}

func TestReadsMatchBacking(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	srv := mount(t, Options{Backing: backing, MountPoint: mp, Controller: &fakeController{}})
	if live, err := IsFUSEMount(mp); err != nil || !live {
		t.Fatalf("IsFUSEMount(%s) = %v, %v after Mount", mp, live, err)
	}
	if live, _ := IsFUSEMount(backing); live {
		t.Fatalf("IsFUSEMount(%s) = true for a plain directory", backing)
	}
	want := manifest(t, backing)
	sameManifest(t, "through the mount", manifest(t, mp), want)
	// Twice: the second walk is served from the kernel's caches.
	sameManifest(t, "through the mount, cached", manifest(t, mp), want)
	// And the root itself, which the walk names ".".
	var got, st unix.Stat_t
	must(unix.Stat(mp, &got))
	must(unix.Stat(srv.BackingPath(), &st))
	if got.Mode != st.Mode || got.Nlink != st.Nlink || got.Uid != st.Uid {
		t.Errorf("root: mode %o nlink %d uid %d, want %o %d %d", got.Mode, got.Nlink, got.Uid, st.Mode, st.Nlink, st.Uid)
	}
}

func TestRefusesChanges(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{}
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl})
	before := manifest(t, backing)
	in := func(name string) string { return filepath.Join(mp, name) }
	vendor := in("sys/bus/pci/devices/0000:01:00.0/vendor")

	cases := []struct {
		op   string
		want syscall.Errno
		do   func() error
	}{
		{"write-open (echo >) a read-only file", syscall.EACCES, func() error {
			return os.WriteFile(vendor, []byte("0x1234\n"), 0o644)
		}},
		{"O_RDWR open", syscall.EACCES, func() error {
			f, err := os.OpenFile(vendor, os.O_RDWR, 0)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"O_APPEND open", syscall.EACCES, func() error {
			f, err := os.OpenFile(vendor, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				f.Close()
			}
			return err
		}},
		{"create", syscall.EACCES, func() error { return os.WriteFile(in("new"), nil, 0o644) }},
		{"create in a subdirectory", syscall.EACCES, func() error { return os.WriteFile(in("d1/new"), nil, 0o644) }},
		{"O_TMPFILE", syscall.EOPNOTSUPP, func() error {
			fd, err := unix.Open(mp, unix.O_TMPFILE|unix.O_WRONLY, 0o644)
			if err == nil {
				unix.Close(fd)
			}
			return err
		}},
		{"mkdir", syscall.EPERM, func() error { return os.Mkdir(in("newdir"), 0o755) }},
		{"mknod", syscall.EPERM, func() error { return unix.Mkfifo(in("fifo"), 0o644) }},
		{"symlink", syscall.EPERM, func() error { return os.Symlink("x", in("newlink")) }},
		{"link", syscall.EPERM, func() error { return os.Link(in("a"), in("hard")) }},
		{"unlink", syscall.EPERM, func() error { return unix.Unlink(in("a")) }},
		{"unlink a symlink", syscall.EPERM, func() error { return unix.Unlink(in("l")) }},
		{"unlink a control file", syscall.EPERM, func() error { return unix.Unlink(in("ctl")) }},
		{"rmdir", syscall.EPERM, func() error { return unix.Rmdir(in("sys/empty")) }},
		{"rename", syscall.EPERM, func() error { return os.Rename(in("a"), in("b")) }},
		{"rename over", syscall.EPERM, func() error { return os.Rename(in("a"), in("ctl")) }},
		{"truncate", syscall.EACCES, func() error { return os.Truncate(vendor, 0) }},
		{"chmod", syscall.EACCES, func() error { return os.Chmod(in("a"), 0o777) }},
		{"chmod a control file", syscall.EACCES, func() error { return os.Chmod(in("ctl"), 0o777) }},
		{"chmod a directory", syscall.EACCES, func() error { return os.Chmod(in("d1"), 0o700) }},
		{"chown", syscall.EACCES, func() error { return os.Lchown(in("a"), 1, 1) }},
		{"chown a symlink", syscall.EACCES, func() error { return os.Lchown(in("l"), 1, 1) }},
		{"utimes", syscall.EACCES, func() error { return os.Chtimes(in("a"), time.Unix(1, 0), time.Unix(1, 0)) }},
		{"utimes a control file", syscall.EACCES, func() error { return os.Chtimes(in("ctl"), time.Unix(1, 0), time.Unix(1, 0)) }},
		{"setxattr", syscall.EACCES, func() error { return unix.Setxattr(in("a"), "user.x", []byte("1"), 0) }},
		{"removexattr", syscall.EACCES, func() error { return unix.Removexattr(in("a"), "user.x") }},
	}
	for _, c := range cases {
		err := c.do()
		if got := errnoOf(err); got != c.want {
			t.Errorf("%s: got %v (%v), want %v", c.op, got, err, c.want)
		}
	}
	if calls := ctl.Calls(); len(calls) != 0 {
		t.Errorf("refused operations reached the controller: %q", calls)
	}
	sameManifest(t, "backing after the refused changes", manifest(t, backing), before)
}

func TestControlWrite(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{}
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl})
	name := filepath.Join(mp, "ctl")

	// What `echo 0000:01:00.0 > ctl` does: a truncating, creating open
	// and one write.
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		t.Fatalf("truncating open of a control file: %v", err)
	}
	n, err := f.Write([]byte("0000:01:00.0\n"))
	if err != nil || n != 13 {
		t.Fatalf("write = %d, %v; want 13, nil", n, err)
	}
	// Each write(2) is one call, whatever the offset.
	if _, err := f.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	must(f.Close())

	f, err = os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("O_RDWR open of a control file: %v", err)
	}
	if _, err := f.Write([]byte("third")); err != nil {
		t.Fatal(err)
	}
	// Reading through the same descriptor: the backing file, untouched by
	// the truncation.
	buf := make([]byte, 64)
	n, err = f.ReadAt(buf, 0)
	if string(buf[:n]) != "idle\n" {
		t.Errorf("read back %q (%v), want %q", buf[:n], err, "idle\n")
	}
	must(f.Close())

	// truncate(2) of a control file is accepted and truncates nothing, as
	// on sysfs.
	if err := os.Truncate(name, 0); err != nil {
		t.Errorf("truncate of a control file: %v", err)
	}
	want := []string{"ctl 0000:01:00.0\n", "ctl second", "ctl third"}
	if got := ctl.Calls(); !slices.Equal(got, want) {
		t.Errorf("controller calls %q, want %q", got, want)
	}
	if data, _ := os.ReadFile(filepath.Join(backing, "ctl")); string(data) != "idle\n" {
		t.Errorf("backing ctl is %q after truncating opens, want %q", data, "idle\n")
	}

	// A real shell, as a user types it.
	if sh, err := exec.LookPath("sh"); err == nil {
		out, err := exec.Command(sh, "-c", "echo shell > "+name).CombinedOutput()
		if err != nil {
			t.Errorf("sh -c 'echo shell > ctl': %v: %s", err, out)
		}
		if got := ctl.Calls(); got[len(got)-1] != "ctl shell\n" {
			t.Errorf("last controller call %q, want %q", got[len(got)-1], "ctl shell\n")
		}
	}
}

func TestWriteErrno(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{}
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl})
	name := filepath.Join(mp, "ctl")

	err := os.WriteFile(name, []byte("bad\n"), 0o644)
	if errnoOf(err) != syscall.ENODEV {
		t.Errorf("write of bad: %v, want ENODEV", err)
	}
	if got := ctl.Calls(); len(got) != 1 {
		t.Errorf("controller calls %q, want one", got)
	}
	// The message a user sees.
	if bash, err := exec.LookPath("bash"); err == nil {
		out, err := exec.Command(bash, "-c", "echo bad > "+name).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "No such device") {
			t.Errorf("bash -c 'echo bad > ctl': %v, %q; want it to fail with No such device", err, out)
		}
	}
}

// readerView is what a reader sees of the paths the "x" write changes.
type readerView struct {
	a, l, ctl string
	aSize     int64 // as stat says
	d1, d2    bool  // exists
	d2g       string
	root      []string
}

func look(t *testing.T, mp string) readerView {
	t.Helper()
	var v readerView
	// Stat before the read: opening the file may refresh its attributes.
	st, err := os.Lstat(filepath.Join(mp, "a"))
	if err != nil {
		t.Fatal(err)
	}
	v.aSize = st.Size()
	data, err := os.ReadFile(filepath.Join(mp, "a"))
	if err != nil {
		t.Fatal(err)
	}
	v.a = string(data)
	if v.l, err = os.Readlink(filepath.Join(mp, "l")); err != nil {
		t.Fatal(err)
	}
	data, err = os.ReadFile(filepath.Join(mp, "ctl"))
	if err != nil {
		t.Fatal(err)
	}
	v.ctl = string(data)
	_, err = os.Lstat(filepath.Join(mp, "d1", "f"))
	v.d1 = err == nil
	_, err = os.Lstat(filepath.Join(mp, "d2"))
	v.d2 = err == nil
	data, _ = os.ReadFile(filepath.Join(mp, "d2", "g"))
	v.d2g = string(data)
	entries, err := os.ReadDir(mp)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		v.root = append(v.root, e.Name())
	}
	return v
}

// beforeX and afterX are the views before and after the "x" write.
func beforeX() readerView {
	return readerView{a: "short", aSize: 5, l: "target-one", ctl: "idle\n", d1: true,
		root: []string{"a", "ctl", "ctl2", "ctl3", "d1", "l", "sys"}}
}

func afterX() readerView {
	return readerView{a: "a much longer content than before\n", aSize: 34, l: "target-two-is-longer", ctl: "x\n", d2: true, d2g: "g\n",
		root: []string{"a", "ctl", "ctl2", "ctl3", "d2", "l", "sys"}}
}

func checkView(t *testing.T, when string, got, want readerView) {
	t.Helper()
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s:\n got %+v\nwant %+v", when, got, want)
	}
}

// TestWriteInvalidates: with the default timeouts, a reader that has
// everything cached sees the new tree as soon as the write returns.
func TestWriteInvalidates(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{root: func() string { return backing }}
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl})

	checkView(t, "before", look(t, mp), beforeX())
	look(t, mp) // everything in the kernel's caches, d2's absence too
	writeCtl(t, mp)
	checkView(t, "right after the write", look(t, mp), afterX())
}

// TestCachesAreReal is the control for TestWriteInvalidates: the same
// change, unreported, is not seen while the caches last, so the test above
// shows the invalidation and not an absence of caching.
func TestCachesAreReal(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{root: func() string { return backing }, silent: true}
	// Long timeouts, so a slow machine does not expire them mid-test.
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl,
		EntryTimeout: time.Minute, AttrTimeout: time.Minute, NegativeTimeout: time.Minute})

	look(t, mp)
	writeCtl(t, mp)
	got := look(t, mp)
	stale := afterX()
	// Content: with FUSE passthrough (Linux 6.9 on) the kernel reads the
	// file the open found, the new one, whole; without, the new one cut
	// to the cached size.
	if got.a != afterX().a {
		stale.a = afterX().a[:len("short")]
	}
	stale.aSize = 5        // cached attributes
	stale.l = "target-one" // cached link text
	stale.d1 = true        // cached entries
	stale.d2 = false       // the cached absence
	stale.d2g = ""
	// Listings are never cached: the kernel asks at every readdir.
	checkView(t, "unreported change", got, stale)
}

// TestInvalidate: a change made outside Write (the serve loop's
// re-render) is seen once Invalidate returns.
func TestInvalidate(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	srv := mount(t, Options{Backing: backing, MountPoint: mp, Controller: &fakeController{}})
	look(t, mp)
	look(t, mp)
	ctl := &fakeController{root: func() string { return backing }}
	changed, errno := ctl.Write("ctl", []byte("x\n"))
	if errno != 0 {
		t.Fatal(errno)
	}
	// Also rewrite a file in place (same inode, longer), which only
	// dropping its pages and attributes shows.
	vendor := "sys/bus/pci/devices/0000:01:00.0/vendor"
	if got, _ := os.ReadFile(filepath.Join(mp, vendor)); string(got) != "0x10de\n" {
		t.Fatalf("vendor %q", got)
	}
	must(os.WriteFile(filepath.Join(backing, vendor), []byte("0x10de plus more\n"), 0o444))
	srv.Invalidate(append(changed, vendor, "/sys/not/known/", ""))
	checkView(t, "after Invalidate", look(t, mp), afterX())
	if got, _ := os.ReadFile(filepath.Join(mp, vendor)); string(got) != "0x10de plus more\n" {
		t.Errorf("vendor rewritten in place reads %q after Invalidate", got)
	}

	// Reporting a directory drops what is cached below it.
	dev := "sys/bus/pci/devices/0000:01:00.0"
	empty := filepath.Join(mp, dev, "empty")
	if st, err := os.Lstat(empty); err != nil || st.Size() != 0 {
		t.Fatalf("%s: %v, %v", empty, st, err)
	}
	must(os.WriteFile(filepath.Join(backing, dev, "empty"), []byte("not any more\n"), 0o444))
	must(os.WriteFile(filepath.Join(backing, dev, "new"), []byte("new\n"), 0o444))
	srv.Invalidate([]string{dev})
	if st, err := os.Lstat(empty); err != nil || st.Size() != 13 {
		t.Errorf("%s after Invalidate of its directory: %v, %v; want size 13", empty, st, err)
	}
	if got, err := os.ReadFile(filepath.Join(mp, dev, "new")); string(got) != "new\n" {
		t.Errorf("new file after Invalidate of its directory: %q, %v", got, err)
	}
}

func TestConcurrentWritesSerialized(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	ctl := &fakeController{delay: time.Millisecond}
	mount(t, Options{Backing: backing, MountPoint: mp, Controller: ctl})

	const writers, writes = 8, 10
	var wg sync.WaitGroup
	want := []string{}
	for w := range writers {
		name := []string{"ctl", "ctl2", "ctl3"}[w%3]
		for i := range writes {
			want = append(want, fmt.Sprintf("%s w%d-%d", name, w, i))
		}
		wg.Go(func() {
			// Each writer its own descriptor, as separate processes.
			f, err := os.OpenFile(filepath.Join(mp, name), os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			defer f.Close()
			for i := range writes {
				if _, err := fmt.Fprintf(f, "w%d-%d", w, i); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if m := ctl.maxInflight.Load(); m != 1 {
		t.Errorf("%d controller calls ran at once, want 1", m)
	}
	got := ctl.Calls()
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("controller calls:\n got %q\nwant %q", got, want)
	}
}

// TestBackingIsMountPoint serves a directory over itself, and checks that
// the server reaches the directory under the mount, not the mount.
func TestBackingIsMountPoint(t *testing.T) {
	overlaytest.RequireFUSE(t)
	dir := t.TempDir()
	smallTree(t, dir)
	want := manifest(t, dir)
	var under unix.Statfs_t
	must(unix.Statfs(dir, &under))

	ctl := &fakeController{}
	srv := mount(t, Options{Backing: dir, MountPoint: dir, Controller: ctl})
	ctl.root = srv.BackingPath
	if live, err := IsFUSEMount(dir); err != nil || !live {
		t.Fatalf("IsFUSEMount(%s) = %v, %v after Mount", dir, live, err)
	}
	var over, backing unix.Statfs_t
	must(unix.Statfs(dir, &over))
	must(unix.Statfs(srv.BackingPath(), &backing))
	const fuseMagic = 0x65735546
	if over.Type != fuseMagic {
		t.Fatalf("%s has file system type %#x after Mount, want FUSE's", dir, over.Type)
	}
	if backing.Type != under.Type || backing.Fsid != under.Fsid {
		t.Fatalf("BackingPath %s reaches file system %#x %v, want the shadowed %#x %v", srv.BackingPath(), backing.Type, backing.Fsid, under.Type, under.Fsid)
	}

	// A server recursing into its own mount would never answer; bound the
	// wait so the test fails instead of hanging.
	walked := make(chan map[string]string, 1)
	go func() { walked <- manifest(t, dir) }()
	select {
	case got := <-walked:
		// The same inode numbers too: the very files, not copies.
		sameManifest(t, "served over itself", got, want)
	case <-time.After(10 * time.Second):
		t.Fatal("walking the mount over its own backing tree did not finish in 10s")
	}

	writeCtl(t, dir)
	checkView(t, "after a write, over itself", look(t, dir), afterX())
	if err := srv.Unmount(); err != nil {
		t.Fatal(err)
	}
	// The controller wrote the shadowed directory, which now shows.
	checkView(t, "after Unmount, on disk", look(t, dir), afterX())
}

// TestStaleMount: a server killed without unmounting leaves a dead mount,
// which Mount detaches; a live one it refuses.
func TestStaleMount(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	child := startServer(t, backing, mp)

	_, err := Mount(Options{Backing: backing, MountPoint: mp})
	if err == nil {
		t.Fatal("Mount over a live FUSE mount succeeded")
	}
	if msg := err.Error(); !strings.Contains(msg, mp) || !strings.Contains(msg, "live") || strings.Contains(msg, "\n") {
		t.Errorf("refusal %q: want one line naming %s as live", msg, mp)
	}
	t.Log(err)

	must(child.Process.Kill())
	child.Wait()
	// The kernel still answers stat of the dead mount's root from its
	// cache; statfs always asks the server.
	var st unix.Statfs_t
	if err := unix.Statfs(mp, &st); err != unix.ENOTCONN {
		t.Fatalf("statfs of the killed server's mount: %v, want ENOTCONN", err)
	}

	srv := mount(t, Options{Backing: backing, MountPoint: mp})
	sameManifest(t, "after recovering the mount", manifest(t, mp), manifest(t, backing))
	must(srv.Unmount())
	if live, _ := IsFUSEMount(mp); live {
		t.Errorf("%s still a FUSE mount after Unmount: the dead mount was not detached", mp)
	}
}

// TestStaleMountOverBacking: the dead mount covers the backing tree itself;
// detaching it must come before opening the tree.
func TestStaleMountOverBacking(t *testing.T) {
	overlaytest.RequireFUSE(t)
	dir := t.TempDir()
	smallTree(t, dir)
	want := manifest(t, dir)
	child := startServer(t, dir, dir)
	must(child.Process.Kill())
	child.Wait()

	mount(t, Options{Backing: dir, MountPoint: dir})
	sameManifest(t, "after recovering the mount over itself", manifest(t, dir), want)
}

func TestUnmountWait(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp := t.TempDir(), t.TempDir()
	smallTree(t, backing)
	srv, err := Mount(Options{Backing: backing, MountPoint: mp})
	if err != nil {
		t.Fatal(err)
	}
	waited := make(chan struct{})
	go func() { srv.Wait(); close(waited) }()

	// Busy: a file held open under the mount.
	f, err := os.Open(filepath.Join(mp, "a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Unmount(); err == nil || !strings.Contains(err.Error(), mp) {
		t.Errorf("Unmount with a file open: %v, want an error naming %s", err, mp)
	}
	select {
	case <-waited:
		t.Fatal("Wait returned while still mounted")
	default:
	}
	f.Close()

	if err := srv.Unmount(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after Unmount")
	}
	if err := srv.Unmount(); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
	if live, _ := IsFUSEMount(mp); live {
		t.Errorf("%s still mounted", mp)
	}

	// Unmounted by someone else: Wait returns too.
	srv, err = Mount(Options{Backing: backing, MountPoint: mp})
	if err != nil {
		t.Fatal(err)
	}
	must(unix.Unmount(mp, 0))
	done := make(chan struct{})
	go func() { srv.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Wait did not return after umount(2)")
	}
}

func TestMountErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	must(os.WriteFile(file, nil, 0o644))
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{Backing: dir}, "MountPoint"},
		{Options{Backing: filepath.Join(dir, "missing"), MountPoint: dir}, filepath.Join(dir, "missing")},
		{Options{Backing: dir, MountPoint: filepath.Join(dir, "missing")}, filepath.Join(dir, "missing")},
		{Options{Backing: dir, MountPoint: file}, file + " is not a directory"},
		{Options{Backing: file, MountPoint: dir}, file},
	} {
		srv, err := Mount(c.opts)
		if err == nil {
			srv.Unmount()
			t.Errorf("Mount(%+v) succeeded", c.opts)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, c.want) || strings.Contains(msg, "\n") {
			t.Errorf("Mount(%+v): %q, want one line with %q", c.opts, msg, c.want)
		}
	}
}

// TestUnmountHeldElsewhere: a copy of the mount (as a container's bind
// mount is) keeps the connection after the mount point is unmounted;
// Unmount says so within its wait instead of waiting for ever, and the
// view ends once the copy goes.
func TestUnmountHeldElsewhere(t *testing.T) {
	overlaytest.RequireFUSE(t)
	backing, mp, copyAt := t.TempDir(), t.TempDir(), t.TempDir()
	smallTree(t, backing)
	srv, err := Mount(Options{Backing: backing, MountPoint: mp})
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount(mp, copyAt, "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = srv.Unmount()
	var held *HeldElsewhereError
	if !errors.As(err, &held) {
		t.Fatalf("Unmount with a copy held elsewhere: %v, want a *HeldElsewhereError", err)
	}
	if took := time.Since(start); took > 3*heldWait {
		t.Errorf("Unmount took %v", took)
	}
	if fuse, _ := IsFUSEMount(mp); fuse {
		t.Error("still mounted at the mount point")
	}
	if err := syscall.Unmount(copyAt, 0); err != nil {
		t.Fatal(err)
	}
	select {
	case <-srv.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the view did not end once its last copy went")
	}
}

// writeCtl writes the small tree's control file through the view at dir,
// the write on which the fake controller changes the tree.
func writeCtl(t *testing.T, dir string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "ctl"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}
