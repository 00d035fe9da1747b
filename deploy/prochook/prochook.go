// Package prochook is the OCI createContainer hook that serves the
// rendered /proc files (plan.ProcDir: /proc/modules, /proc/devices,
// /proc/driver/nvidia) to a container. runc refuses a config.json mount
// inside /proc, but it runs createContainer hooks in the container's mount
// namespace after its mounts and before pivot_root, where a bind mount over
// <rootfs>/proc/<entry> is allowed: the NVIDIA Container Toolkit serves
// /proc/driver/nvidia/params the same way. docs/design/prochook.md says what
// it mounts, how it keeps to the container's own procfs, and how it fails.
//
// The pure part (ParseState, Rootfs, Entries) decides; mount.go does.
package prochook

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// The hook's argv, as an OCI hook (config.json, a CDI spec's hook, an NRI
// adjustment) carries it, has one definition: cdispec.ProcHook, whose
// ProcHookCommand is this package's command.

// stateName names the OCI state in messages: the runtime writes it to the
// hook's standard input.
const stateName = "the OCI state on stdin"

// ParseState reads the OCI state the runtime gives a hook (runtime spec,
// "State"): the hook needs its bundle, and names the container by its id.
func ParseState(data []byte) (specs.State, error) {
	var st specs.State
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("%s: %v (%d bytes)", stateName, err, len(data))
	}
	if !filepath.IsAbs(st.Bundle) {
		return st, fmt.Errorf("%s: field bundle: value %q: want the bundle's absolute path", stateName, st.Bundle)
	}
	return st, nil
}

// Rootfs is the container's root file system on the host, from the
// bundle's config.json: root.path, relative to the bundle or absolute.
func Rootfs(bundle string, config []byte) (string, error) {
	name := filepath.Join(bundle, "config.json")
	var spec struct {
		Root *specs.Root `json:"root"`
	}
	if err := json.Unmarshal(config, &spec); err != nil {
		return "", fmt.Errorf("%s: %v", name, err)
	}
	if spec.Root == nil || spec.Root.Path == "" {
		return "", fmt.Errorf("%s: field root.path: value \"\": want the container's root file system", name)
	}
	if filepath.IsAbs(spec.Root.Path) {
		return filepath.Clean(spec.Root.Path), nil
	}
	return filepath.Join(bundle, spec.Root.Path), nil
}

// Entries lists what the hook mounts: the top-level entries of the
// render's proc directory, each over the container's /proc/<entry>. A
// render made before the proc directory existed has none. Only files and
// directories are rendered there; anything else is refused, since the
// mount would serve what it points to.
func Entries(root fs.FS, rootName string) ([]string, error) {
	des, err := fs.ReadDir(root, plan.ProcDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(rootName, plan.ProcDir), err)
	}
	var names []string
	for _, de := range des {
		if t := de.Type(); t != 0 && t != fs.ModeDir {
			return nil, fmt.Errorf("%s: type %v: want a file or a directory", filepath.Join(rootName, plan.ProcDir, de.Name()), t)
		}
		names = append(names, de.Name())
	}
	return names, nil
}

// Options adjust the hook. The zero value reads the host's files.
type Options struct {
	// Root is the render as a file system; nil means os.DirFS of the
	// root Run is given.
	Root fs.FS
	// ReadFile reads the bundle's config.json; nil means os.ReadFile.
	ReadFile func(name string) ([]byte, error)
}

// Result is what the hook did.
type Result struct {
	// Container is the container's id, from the state.
	Container string
	// Unrendered, when not nil, says why the root holds no complete
	// render: the hook then mounted nothing, and the container starts
	// with its node's /proc.
	Unrendered error
	// Mounted lists the container paths mounted over (/proc/devices).
	Mounted []string
	// Missing lists the container paths the kernel lacks, so nothing was
	// mounted there: a mount needs its target, and procfs makes none (a
	// kernel built without modules has no /proc/modules).
	Missing []string
}

// Run is the hook: state is what the runtime wrote to its standard input,
// root the render to serve (an absolute path: a runtime runs hooks in a
// directory of its choosing). An error is one line naming what failed;
// the runtime then refuses to create the container.
func Run(root string, state []byte, opts Options) (Result, error) {
	st, err := ParseState(state)
	if err != nil {
		return Result{}, err
	}
	res := Result{Container: st.ID}
	fsys := opts.Root
	if fsys == nil {
		fsys = os.DirFS(root)
	}
	if err := cdispec.CheckRendered(fsys, root); err != nil {
		res.Unrendered = err
		return res, nil
	}
	readFile := opts.ReadFile
	if readFile == nil {
		readFile = os.ReadFile
	}
	config, err := readFile(filepath.Join(st.Bundle, "config.json"))
	if err != nil {
		return res, fmt.Errorf("the container's bundle: %w", err)
	}
	rootfs, err := Rootfs(st.Bundle, config)
	if err != nil {
		return res, err
	}
	entries, err := Entries(fsys, root)
	if err != nil {
		return res, err
	}
	for _, e := range entries {
		target := path.Join("/proc", e)
		mounted, err := mountEntry(filepath.Join(root, plan.ProcDir), rootfs, e)
		switch {
		case err != nil:
			return res, fmt.Errorf("%s (the container's %s): %w", filepath.Join(rootfs, "proc", e), target, err)
		case mounted:
			res.Mounted = append(res.Mounted, target)
		default:
			res.Missing = append(res.Missing, target)
		}
	}
	return res, nil
}

// Summary is the hook's lines for standard error: one per entry the
// kernel lacks and one for what it mounted, or one saying why it did
// nothing.
func (r Result) Summary(root string) []string {
	if r.Unrendered != nil {
		return []string{fmt.Sprintf("container %s: nothing mounted: %v", r.Container, r.Unrendered)}
	}
	var lines []string
	for _, m := range r.Missing {
		lines = append(lines, fmt.Sprintf("container %s: %s skipped: this kernel has no %s to mount over", r.Container, m, m))
	}
	if len(r.Mounted) > 0 {
		lines = append(lines, fmt.Sprintf("container %s: mounted %s from %s, read-only", r.Container, strings.Join(r.Mounted, ", "), filepath.Join(root, plan.ProcDir)))
	}
	return lines
}

// ReadState reads the state from the runtime's pipe; nil reads nothing.
func ReadState(r io.Reader) ([]byte, error) {
	if r == nil {
		return nil, nil
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", stateName, err)
	}
	return b, nil
}
