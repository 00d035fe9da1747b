package hosttest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"

	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// Served is what a served container sees of a rendered overlay, recreated
// in a private mount namespace of this machine: the overlay read-only at
// its container root and the links directory read-only at each of LinksAt,
// as the CDI spec's two bind mounts give them. It is the one mount set that
// every end-to-end test uses, so what they prove is what a container gets.
//
// The zero value, apart from Root, is a default container: the overlay at
// /opt/nvml-mock and the links directory at /sys/bus/pci/devices.
type Served struct {
	// Root is the rendered overlay on the host. Empty mounts no overlay:
	// the node as it is, for negative controls.
	Root string
	// ContainerRoot is where the overlay appears; empty means
	// plan.DefaultContainerRoot.
	ContainerRoot string
	// LinksAt lists where the links directory appears; empty means the
	// kernel's own /sys/bus/pci/devices. A target under a directory that
	// does not exist (node-feature-discovery's /host-sys) gets a tmpfs on
	// its top-level directory; a top-level directory the host lacks exists
	// only in the namespace's private root (see Script), never on the host.
	LinksAt []string
	// NoLinks mounts the overlay but not the links directory: a container
	// that got the overlay without the device.
	NoLinks bool
	// Tmpfs lists directories that get a private empty tmpfs, such as /run
	// for a private daemon's sockets and state.
	Tmpfs []string
	// Binds are read-only bind mounts made after the tmpfs mounts, so a
	// target may lie in one: a CDI spec directory at /run/cdi. A missing
	// target must lie in one of Tmpfs or in a top-level directory the host
	// lacks, or its mkdir would write to the host.
	Binds []Bind
	// HostSysAt lists where the node's own /sys also appears, read-only,
	// under the links directory when LinksAt names a path below it: as
	// node-feature-discovery's DaemonSet mounts /sys at /host-sys. Links
	// of host devices (--host-devices merge) resolve only there.
	HostSysAt []string
	// Env is added to the environment of what runs inside.
	Env []string
	// Spec, when set, replaces Root's mounts with a CDI spec's, applied in
	// order as runc applies them: a bind mount each, remounted read-only
	// where its options say ro. A target that does not exist is created in
	// an in-memory layer (overlayfs) over its top-level directory, as runc
	// creates it in the container's own root, so nothing reaches the
	// host's disk.
	Spec []*specs.Mount
	// Enter, when set, is a process whose mount namespace the private one
	// is made from: a daemon's that mounted what Spec's sources are (serve
	// --writable's FUSE view, in a namespace of its own).
	Enter int
}

// Bind is a read-only bind mount of a host path; Target is created if
// missing.
type Bind struct {
	Source, Target string
}

// containerRoot is ContainerRoot or its default.
func (s Served) containerRoot() string {
	if s.ContainerRoot != "" {
		return s.ContainerRoot
	}
	return plan.DefaultContainerRoot
}

// shellQuote quotes for sh: Go's %q is not shell quoting.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// Script is the shell that sets the mounts up inside the namespace and then
// runs its arguments. A tmpfs over the container root's parent keeps the
// host's own directory untouched. Nothing is created on the host: where a
// mount's top-level directory is missing there (node-feature-discovery's
// /host-sys), the mounts are made in a private root instead (privateRoot).
func (s Served) Script() string {
	mounts := s.mounts()
	tops := s.missingTops()
	if len(tops) == 0 {
		return mounts + `exec "$@"` + "\n"
	}
	return s.privateRoot(tops, mounts+`exec "$@"`+"\n")
}

// mounts is the shell that makes the mounts, in a root where every
// mountpoint's top-level directory exists.
func (s Served) mounts() string {
	q := shellQuote
	lines := []string{"set -eu"}
	// bindRO is a read-only bind mount, as runc makes a CDI "ro" mount.
	bindRO := func(src, dst string) {
		lines = append(lines, "mount --bind "+q(src)+" "+q(dst), "mount -o remount,bind,ro "+q(dst))
	}
	for _, dir := range s.Tmpfs {
		lines = append(lines, "mkdir -p "+q(dir), "mount -t tmpfs -o mode=0755 tmpfs "+q(dir))
	}
	for _, b := range s.Binds {
		lines = append(lines, "mkdir -p "+q(b.Target))
		bindRO(b.Source, b.Target)
	}
	for _, dir := range s.HostSysAt {
		lines = append(lines, "mkdir -p "+q(dir))
		bindRO("/sys", dir)
	}
	if len(s.Spec) > 0 {
		return strings.Join(append(lines, specMounts(s.Spec)), "\n") + "\n"
	}
	if s.Root == "" {
		return strings.Join(lines, "\n") + "\n"
	}
	cr := s.containerRoot()
	lines = append(lines, "mount -t tmpfs -o mode=0755 tmpfs "+q(filepath.Dir(cr)), "mkdir -p "+q(cr))
	bindRO(s.Root, cr)
	if s.NoLinks {
		return strings.Join(lines, "\n") + "\n"
	}
	tmpfsOn := map[string]bool{}
	for _, target := range s.linksTargets() {
		if _, err := os.Stat(target); err != nil && !s.underHostSys(target) {
			top := topDir(target)
			if !tmpfsOn[top] {
				lines = append(lines, "mkdir -p "+q(top), "mount -t tmpfs -o mode=0755 tmpfs "+q(top))
				tmpfsOn[top] = true
			}
			lines = append(lines, "mkdir -p "+q(target))
		}
		bindRO(filepath.Join(s.Root, plan.LinksDir), target)
	}
	return strings.Join(lines, "\n") + "\n"
}

// specStaging is where specMounts stages sources and keeps its layers'
// upper and work directories, in a tmpfs of the namespace's own. No
// source of a spec may lie below it.
const specStaging = "/mnt"

// specMounts is the shell that applies a CDI spec's mounts.
func specMounts(ms []*specs.Mount) string {
	q := shellQuote
	lines := []string{
		// The staging tmpfs goes on /mnt, which Debian leaves empty: not on
		// /dev/shm or /tmp, where sources lie (a test's TMPDIR).
		`[ -d ` + specStaging + ` ] || { echo "no ` + specStaging + ` to stage a spec's mounts on" >&2; exit 1; }`,
		"mount -t tmpfs -o mode=0755 tmpfs " + specStaging,
		"layers=0",
		// layer gives top-level directory $1 an in-memory writable layer,
		// once: a layer over a directory below another would be hidden by
		// the other's, made later.
		`layered=" "`,
		`layer() { case "$layered" in *" $1 "*) return 0;; esac; layered="$layered$1 "; layers=$((layers+1)); u=` + specStaging + `/layer$layers; mkdir -p $u/upper $u/work; mount -t overlay overlay -o "lowerdir=$1,upperdir=$u/upper,workdir=$u/work" "$1"; }`,
		// ensure makes target $1 (a file when $2 is f) in the layer of the
		// top-level directory its nearest existing ancestor lies in.
		`ensure() { [ -e "$1" ] && return 0; a=$(dirname "$1"); while [ ! -e "$a" ]; do a=$(dirname "$a"); done; top=/$(readlink -f "$a" | cut -d/ -f2); [ "$top" != / ] || { echo "no layer over / for $1" >&2; exit 1; }; layer "$top"; mkdir -p "$(dirname "$1")"; if [ "$2" = f ]; then : >"$1"; else mkdir "$1"; fi; }`,
	}
	// Every source is taken before any target is mounted, as runc takes
	// them from the runtime's namespace: a later source below an earlier
	// target (the node's /sys/bus/pci/drivers, below the tree's drivers
	// mounted over it) must be the node's, not the mount.
	for i, m := range ms {
		// Asked in the namespace: a source may exist only there (the
		// FUSE view of an entered one).
		src, staged := q(m.HostPath), specStaging+"/source"+strconv.Itoa(i)
		lines = append(lines, `if [ -f `+src+` ]; then : >`+staged+`; else mkdir `+staged+`; fi`,
			"mount --bind "+src+" "+staged)
	}
	// Every target is made before any is mounted: a layer made later over
	// a directory with mounts below it would hide them.
	for i, m := range ms {
		staged, dst := specStaging+"/source"+strconv.Itoa(i), q(m.ContainerPath)
		lines = append(lines, `if [ -f `+staged+` ]; then ensure `+dst+` f; else ensure `+dst+` d; fi`)
	}
	for i, m := range ms {
		staged, dst := specStaging+"/source"+strconv.Itoa(i), q(m.ContainerPath)
		lines = append(lines, "mount --bind "+staged+" "+dst)
		if slices.Contains(m.Options, "ro") {
			lines = append(lines, "mount -o remount,bind,ro "+dst)
		}
	}
	return strings.Join(lines, "\n")
}

// linksTargets is LinksAt or its default.
func (s Served) linksTargets() []string {
	if len(s.LinksAt) == 0 {
		return []string{"/" + plan.LinksDir}
	}
	return s.LinksAt
}

// topDir is the top-level directory of an absolute path: /host-sys for
// /host-sys/bus/pci/devices.
func topDir(path string) string {
	return "/" + strings.SplitN(strings.TrimPrefix(path, "/"), "/", 2)[0]
}

// missingTops lists the top-level directories that a mountpoint lies in
// and that the host's root lacks, sorted. A mkdir of one would create it
// on the host's disk, private mount namespace or not. Paths whose top
// exists are made inside a tmpfs mounted there (LinksAt) or must lie in
// one of Tmpfs (Binds).
func (s Served) missingTops() []string {
	paths := append(append([]string{}, s.Tmpfs...), s.HostSysAt...)
	for _, b := range s.Binds {
		paths = append(paths, b.Target)
	}
	if s.Root != "" && !s.NoLinks {
		paths = append(paths, s.linksTargets()...)
	}
	var tops []string
	for _, p := range paths {
		top := topDir(p)
		if _, err := os.Lstat(top); err != nil && !slices.Contains(tops, top) {
			tops = append(tops, top)
		}
	}
	slices.Sort(tops)
	return tops
}

// privateRoot is the shell that builds a root of its own and runs script
// chrooted there, in the directory it was started in: a tmpfs holding
// every entry of the host's root (directories bound recursively, so /proc,
// /dev and /sys keep their mounts; files bound; symbolic links copied)
// plus the missing top-level directories tops, empty. The tmpfs is mounted
// on the container root's parent, which the overlay's own tmpfs hides
// anyway; the host's directory there, reached through the shell's working
// directory once the tmpfs covers its path, is bound back in (without the
// mounts below it). A tmpfs over / itself would hide the node.
func (s Served) privateRoot(tops []string, script string) string {
	q := shellQuote
	at := filepath.Dir(s.containerRoot())
	lines := []string{
		"set -eu",
		`wd=$(pwd)`,
		"cd " + q(at),
		"mount -t tmpfs -o mode=0755 tmpfs " + q(at),
		`for e in /* /.[!.]*; do`,
		`	[ -e "$e" ] || [ -L "$e" ] || continue`,
		`	[ "$e" != ` + q(at) + ` ] || continue`,
		`	if [ -L "$e" ]; then ln -s "$(readlink "$e")" ` + q(at) + `"$e"`,
		`	elif [ -d "$e" ]; then mkdir ` + q(at) + `"$e"; mount --rbind "$e" ` + q(at) + `"$e"`,
		`	else : >` + q(at) + `"$e"; mount --bind "$e" ` + q(at) + `"$e"; fi`,
		`done`,
		"mkdir " + q(at+at),
		// The working directory is the host's directory at the tmpfs's
		// path: --no-canonicalize keeps mount from resolving "." to the
		// path, which now names the tmpfs.
		"mount --no-canonicalize --bind . " + q(at+at),
	}
	for _, top := range tops {
		lines = append(lines, "mkdir "+q(at+top))
	}
	lines = append(lines, "cd /",
		`exec chroot `+q(at)+` sh -c `+q(`cd "$1"; shift`+"\n"+script)+` sh "$wd" "$@"`)
	return strings.Join(lines, "\n") + "\n"
}

// underHostSys reports whether path lies below one of HostSysAt, where
// the node's sysfs, bound there first, provides it.
func (s Served) underHostSys(path string) bool {
	return slices.ContainsFunc(s.HostSysAt, func(dir string) bool {
		return strings.HasPrefix(path, strings.TrimSuffix(dir, "/")+"/")
	})
}

// Command returns a command that runs name with args inside a new private
// mount namespace after Script. The caller starts it; a long-running one
// (a daemon) is killed by its PID like any other child.
func (s Served) Command(name string, args ...string) *exec.Cmd {
	argv := append([]string{"unshare", "--mount", "--propagation", "private",
		"sh", "-c", s.Script(), "sh", name}, args...)
	if s.Enter != 0 {
		argv = append([]string{"nsenter", "--target", strconv.Itoa(s.Enter), "--mount", "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), s.Env...)
	return cmd
}

// Shell runs a shell script inside the namespace and returns its standard
// output and error.
func (s Served) Shell(script string) (stdout, stderr string, err error) {
	return run(s.Command("sh", "-ec", script))
}

// Run runs a program inside the namespace and fails the test if it fails,
// returning its standard output.
func (s Served) Run(t testing.TB, name string, args ...string) string {
	t.Helper()
	stdout, stderr, err := run(s.Command(name, args...))
	if err != nil {
		t.Fatalf("%s %s in the served namespace: %v\nstderr:\n%s\nmounts:\n%s", name, strings.Join(args, " "), err, stderr, s.Script())
	}
	return stdout
}

// childModeEnv names the variable that tells a re-executed test binary
// which child to be. See ChildMode.
const childModeEnv = "NVML_MOCK_SYSFS_TEST_CHILD"

// Reexec returns a command that starts this test binary again inside the
// namespace, as the child named mode. The child's TestMain asks ChildMode
// and runs its own code instead of the tests, so consumer libraries run
// in-process where a container would run them.
func (s Served) Reexec(t testing.TB, mode string, args ...string) *exec.Cmd {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatalf("find the test binary to re-execute: %v", err)
	}
	s.Env = append(s.Env, childModeEnv+"="+mode)
	if _, set := os.LookupEnv("GOGC"); !set {
		s.Env = append(s.Env, "GOGC="+strconv.Itoa(overlaytest.TestGCPercent))
	}
	return s.Command(self, append([]string{"-test.run=^$"}, args...)...)
}

// ChildMode returns the mode a test binary was re-executed in by Reexec,
// or "" when it runs the tests.
func ChildMode() string { return os.Getenv(childModeEnv) }

func run(cmd *exec.Cmd) (string, string, error) {
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// BuildBinary builds the static nvml-mock-sysfs binary into a temporary
// directory and returns its path.
func BuildBinary(t testing.TB) string {
	t.Helper()
	return BuildStatic(t, "./cmd/nvml-mock-sysfs")
}

// wingPath is the wing's directory in the repository: the end-to-end
// suites and their kits, a Go module of its own.
const wingPath = "deploy/e2e"

// Wing returns the wing module's directory, where go test and go build
// run the suites' packages.
func Wing(t testing.TB) string {
	t.Helper()
	return filepath.Join(overlaytest.Repo(t), wingPath)
}

// BuildStatic builds a main package of the repository (a path relative to
// its top, such as ./cmd/nvml-mock-sysfs) as a static binary
// (CGO_ENABLED=0) into a temporary directory and returns its path.
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	return buildStatic(t, pkg, t.TempDir())
}

// buildStatic builds pkg as a static binary into dir.
func buildStatic(t testing.TB, pkg, dir string) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		overlaytest.Missing(t, "the go tool is not on PATH, so the real binary cannot be built: %v", err)
	}
	out := filepath.Join(dir, filepath.Base(pkg))
	// The wing is a module of its own: its packages build in it.
	module, rel := overlaytest.Repo(t), pkg
	if r, ok := strings.CutPrefix(pkg, "./"+wingPath+"/"); ok {
		module, rel = Wing(t), "./"+r
	}
	// Stripped as make build builds it, so the suites run the binary users
	// get, and the link, with no DWARF to write, is the faster.
	cmd := exec.Command(goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", out, rel)
	cmd.Dir = module
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// Binaries builds each main package once per test binary, for the tests
// that run it as a separate process: a link of the static binary takes
// seconds on a busy machine, and each test only runs it. The zero value is
// ready; TestMain calls Close after m.Run to remove the binaries.
type Binaries struct {
	mu    sync.Mutex
	dir   string
	built map[string]string
}

// Static returns pkg (as for BuildStatic) built as a static binary, building
// it on the first call. A test must not change the file.
func (b *Binaries) Static(t testing.TB, pkg string) string {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if p, ok := b.built[pkg]; ok {
		return p
	}
	if b.dir == "" {
		dir, err := os.MkdirTemp("", "overlaytest-binaries-")
		if err != nil {
			t.Fatalf("a directory for the shared binaries: %v", err)
		}
		b.dir, b.built = dir, map[string]string{}
	}
	dir := filepath.Join(b.dir, strconv.Itoa(len(b.built)))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("a directory for %s: %v", pkg, err)
	}
	p := buildStatic(t, pkg, dir)
	b.built[pkg] = p
	return p
}

// Binary is Static of ./cmd/nvml-mock-sysfs, as BuildBinary builds it.
func (b *Binaries) Binary(t testing.TB) string {
	t.Helper()
	return b.Static(t, "./cmd/nvml-mock-sysfs")
}

// Removed is a TestMain's last step: it removes the binaries (Close) and
// returns code, the tests' exit code, or 1 where they passed but the
// binaries could not be removed, so that a test binary that leaves them
// behind is no pass.
//
//	os.Exit(binaries.Removed(overlaytest.Main(m)))
func (b *Binaries) Removed(code int) int {
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return max(code, 1)
	}
	return code
}

// Close removes the binaries built so far.
func (b *Binaries) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dir == "" {
		return nil
	}
	err := os.RemoveAll(b.dir)
	b.dir, b.built = "", nil
	return err
}
