// Package programs gives the end-to-end suites the real programs they run:
// those a registry serves (GPU Feature Discovery, node-feature-discovery,
// ghw, containerd, crictl, etcd, the kube binaries and helm, all from the
// Go module proxy at pinned versions, and small programs of ours), built here,
// and those no registry serves (nvml-mock's NVML, the NVIDIA DRA driver,
// the device plugins and NRI plugins), which whoever runs the tests
// supplies (Supplied). Nothing here builds, fetches or describes building
// a supplied program.
//
// Each build is cached outside the repository, keyed by a digest of its
// recipe, our files and the toolchain, so a warm run rebuilds nothing.
package programs

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Program is a program a registry serves and how to build it: each step
// runs in an empty source tree that holds Files alone, and takes modules
// from the Go module proxy.
type Program struct {
	// Name names the program in progress lines, errors and the cache.
	Name string
	// Files are the repository's own files (paths relative to the
	// repository) copied into the source tree at the given relative paths
	// before building: a test file of ours compiled into a consumer's
	// package, or a small program's go.mod, go.sum and main.go.
	Files map[string]string
	// Steps run in order in the source tree.
	Steps []Step
	// Outputs are the files a successful build leaves in the output
	// directory; a build that leaves any of them missing has failed.
	Outputs []string
}

// Step is one command of a build. In Args and Env, {src} is the source
// tree and {out} the output directory.
type Step struct {
	Args []string
	Env  []string
}

// Cache builds programs into a directory that outlives the repository.
// The zero value uses the user's cache directory and prints progress on
// standard error.
type Cache struct {
	// Dir holds one directory per build; empty means
	// $NVML_MOCK_SYSFS_CACHE, else os.UserCacheDir()/nvml-mock-sysfs.
	Dir string
	// Repo is the repository, for Files.
	Repo string
	// Progress receives one line when a build starts and one when it
	// ends; nil means standard error.
	Progress io.Writer
}

// cacheDir is Dir or its default.
func (c Cache) cacheDir() (string, error) {
	if c.Dir != "" {
		return c.Dir, nil
	}
	if d := os.Getenv("NVML_MOCK_SYSFS_CACHE"); d != "" {
		return d, nil
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("no cache directory for the program builds (set NVML_MOCK_SYSFS_CACHE): %w", err)
	}
	return filepath.Join(d, "nvml-mock-sysfs"), nil
}

// BuildError is a failed build: which program, which step, and what the
// step printed.
type BuildError struct {
	Program, Step string
	Output        string
	Err           error
}

func (e *BuildError) Error() string {
	out := strings.TrimSpace(e.Output)
	if len(out) > 4000 {
		out = "…" + out[len(out)-4000:]
	}
	return fmt.Sprintf("build %s: step %q: %v\n%s", e.Program, e.Step, e.Err, out)
}

func (e *BuildError) Unwrap() error { return e.Err }

// Build returns the output directory of p, building it first unless a
// build of the same sources, recipe and toolchain is cached. Concurrent
// callers (test binaries of several packages) wait for one build.
func (c Cache) Build(p Program) (string, error) {
	progress := c.Progress
	if progress == nil {
		progress = os.Stderr
	}
	dir, err := c.cacheDir()
	if err != nil {
		return "", err
	}
	key, err := c.key(p)
	if err != nil {
		return "", &BuildError{Program: p.Name, Step: "digest sources", Err: err}
	}
	out := filepath.Join(dir, "consumers", p.Name+"-"+key[:16])
	if complete(out, p) {
		return out, nil
	}
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return "", &BuildError{Program: p.Name, Step: "create the cache", Err: err}
	}
	unlock, err := lock(out + ".lock")
	if err != nil {
		return "", &BuildError{Program: p.Name, Step: "lock the cache", Err: err}
	}
	defer unlock()
	if complete(out, p) { // another process built it while this one waited
		return out, nil
	}
	start := time.Now()
	fmt.Fprintf(progress, "programs: building %s (cold build; cached in %s)\n", p.Name, out)
	if err := c.build(p, out); err != nil {
		fmt.Fprintf(progress, "programs: %s failed after %s\n", p.Name, time.Since(start).Round(time.Second))
		return "", err
	}
	fmt.Fprintf(progress, "programs: built %s in %s\n", p.Name, time.Since(start).Round(time.Second))
	return out, nil
}

// complete reports whether out holds a finished build: the marker is
// written after every output, so a killed build is never taken for one.
func complete(out string, p Program) bool {
	if _, err := os.Stat(filepath.Join(out, ".complete")); err != nil {
		return false
	}
	for _, o := range p.Outputs {
		if _, err := os.Stat(filepath.Join(out, o)); err != nil {
			return false
		}
	}
	return true
}

// build runs p's recipe in a scratch source tree beside out and fills out.
func (c Cache) build(p Program, out string) error {
	fail := func(step string, err error, output []byte) error {
		return &BuildError{Program: p.Name, Step: step, Output: string(output), Err: err}
	}
	if err := os.RemoveAll(out); err != nil {
		return fail("clear a partial build", err, nil)
	}
	work := out + ".src"
	if err := os.RemoveAll(work); err != nil {
		return fail("clear a partial source tree", err, nil)
	}
	// The source tree keeps one path across builds, so the Go build
	// cache (which records cgo packages' directories) serves rebuilds.
	defer os.RemoveAll(work)
	if err := os.MkdirAll(work, 0o755); err != nil {
		return fail("create the source tree", err, nil)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fail("create the output directory", err, nil)
	}
	src := work
	for to, from := range p.Files {
		data, err := os.ReadFile(filepath.Join(c.Repo, from))
		if err != nil {
			return fail("copy "+from, err, nil)
		}
		dst := filepath.Join(src, to)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fail("copy "+from, err, nil)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			return fail("copy "+from, err, nil)
		}
	}
	expand := func(s string) string {
		return strings.NewReplacer("{src}", src, "{out}", out).Replace(s)
	}
	for _, s := range p.Steps {
		args := make([]string, len(s.Args))
		for i, a := range s.Args {
			args[i] = expand(a)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = src
		cmd.Env = os.Environ()
		for _, e := range s.Env {
			cmd.Env = append(cmd.Env, expand(e))
		}
		if b, err := cmd.CombinedOutput(); err != nil {
			return fail(strings.Join(s.Args, " "), err, b)
		}
	}
	for _, o := range p.Outputs {
		if _, err := os.Stat(filepath.Join(out, o)); err != nil {
			return fail("collect outputs", err, nil)
		}
	}
	return os.WriteFile(filepath.Join(out, ".complete"), nil, 0o644)
}

// key digests what decides a build's result: our files, the recipe (whose
// module versions are pinned) and the toolchain (go version and environment, and
// the C compiler for cgo builds).
func (c Cache) key(p Program) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "recipe %q\n", fmt.Sprint(p.Steps, p.Outputs))
	for _, to := range slices.Sorted(maps.Keys(p.Files)) {
		data, err := os.ReadFile(filepath.Join(c.Repo, p.Files[to]))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "file %s %d\n", to, len(data))
		h.Write(data)
	}
	for _, tool := range [][]string{{"go", "env", "GOVERSION", "GOARCH", "GOOS", "GOFLAGS", "GOAMD64"}, {"cc", "--version"}} {
		b, err := exec.Command(tool[0], tool[1:]...).Output()
		if err != nil {
			return "", fmt.Errorf("%s: %w", strings.Join(tool, " "), err)
		}
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// lock takes an exclusive flock(2) on path, creating it.
func lock(path string) (func(), error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}
