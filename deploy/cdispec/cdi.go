package cdispec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/google/renameio/v2"
	"gopkg.in/yaml.v3"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// The standalone spec: one device, all, that brings the mounts.
const (
	DefaultKind = "mock.nvidia.com/pcisysfs"
	DeviceName  = "all"
	// StateEnv tells a container whether it got the mock sysfs. A CDI
	// device needs at least one edit, and with --fail-open this is the
	// only one.
	StateEnv        = "NVML_MOCK_SYSFS"
	stateMounted    = "mounted"
	stateUnrendered = "unrendered"
)

// WholeDevicesDir is the mount target that the narrow mounts replace: a
// bind mount over /sys/devices hides the kernel's own devices, CPUs and
// network interfaces from the container.
const WholeDevicesDir = "/sys/devices"

// CheckKind refuses a kind the CDI library would refuse, before any work.
func CheckKind(kind string) error {
	vendor, class := parser.ParseQualifier(kind)
	if vendor == "" || class == "" {
		return fmt.Errorf("kind %q: want vendor/class, like %s", kind, DefaultKind)
	}
	if err := parser.ValidateVendorName(vendor); err != nil {
		return fmt.Errorf("kind %q: %w", kind, err)
	}
	if err := parser.ValidateClassName(class); err != nil {
		return fmt.Errorf("kind %q: %w", kind, err)
	}
	return nil
}

// NewSpec builds the standalone spec: device all with the mounts, the
// variables of Env and the hooks (ProcHook), or, when mounts is empty
// (--fail-open on an unrendered root), with none of them. Its cdiVersion
// is the lowest its content needs, so older runtimes take it: podman 4.3
// reads at most 0.5.0, and variables and hooks need nothing newer than
// mounts do.
func NewSpec(kind string, mounts []Mount, env []string, hooks ...*specs.Hook) (*specs.Spec, error) {
	if err := CheckKind(kind); err != nil {
		return nil, err
	}
	s := &specs.Spec{
		Kind:    kind,
		Devices: []specs.Device{{Name: DeviceName, ContainerEdits: DeviceEdits(mounts, env, hooks...)}},
	}
	v, err := specs.MinimumRequiredVersion(s)
	if err != nil {
		return nil, err
	}
	s.Version = v
	return s, nil
}

// DeviceEdits is the one definition of what a served container gets: the
// mounts, the variables of Env and the hooks (ProcHook), and StateEnv
// saying whether it got them (with no mounts, --fail-open on an
// unrendered root, it gets StateEnv alone: a hook serves the tree's files
// and needs the tree). The CDI device carries these edits, and serve's
// NRI plugin applies these very edits (package nriplugin), so the two
// channels cannot drift apart.
func DeviceEdits(mounts []Mount, env []string, hooks ...*specs.Hook) specs.ContainerEdits {
	state := stateMounted
	if len(mounts) == 0 {
		state, env, hooks = stateUnrendered, nil, nil
	}
	return specs.ContainerEdits{
		Env:    append([]string{StateEnv + "=" + state}, env...),
		Mounts: cdiMounts(mounts),
		Hooks:  cloneHooks(hooks),
	}
}

// ProcHookCommand is the subcommand of our binary that a createContainer
// hook runs (ProcHook): it bind-mounts the tree's /proc files in the
// container, where runc refuses a mount (docs/design/modules.md).
const ProcHookCommand = "proc-hook"

// ProcHook is the one definition of the hook that serves the tree's /proc
// files: the createContainer hook (run in the container's mount namespace
// after its mounts, before pivot_root) that runs binary, our own executable on
// the node, as `binary proc-hook --root ROOT --failures FILE`, ROOT the
// overlay root on the node and FILE ProcHookFailures(binary), where the
// hook, which fails open, records what it could not do.
func ProcHook(binary, root string) *specs.Hook {
	return &specs.Hook{HookName: cdi.CreateContainerHook, Path: binary,
		Args: []string{binary, ProcHookCommand, "--root", root, "--failures", ProcHookFailures(binary)}}
}

// ProcHookFailures is the file beside the hook's binary where the hook
// appends a line per container it could not serve, which serve counts
// (its metric proc_hook_failures_total): a hook that fails open says so
// nowhere else, since a runtime shows a hook's output only when it fails.
func ProcHookFailures(binary string) string {
	return filepath.Join(filepath.Dir(binary), "proc-hook-failures")
}

// isProcHook reports whether a hook is one ProcHook made, whatever its
// binary and root: an older copy of ours.
func isProcHook(h *specs.Hook) bool {
	return h != nil && h.HookName == cdi.CreateContainerHook && len(h.Args) > 1 && h.Args[1] == ProcHookCommand
}

func cloneHooks(hs []*specs.Hook) []*specs.Hook {
	var out []*specs.Hook
	for _, h := range hs {
		c := *h
		c.Args, c.Env = slices.Clone(h.Args), slices.Clone(h.Env)
		out = append(out, &c)
	}
	return out
}

// cdiMounts converts the mount set. The type stays empty: runc and crun
// bind-mount whatever carries the bind option, and a type would raise the
// spec to cdiVersion 0.4.0 for nothing.
func cdiMounts(ms []Mount) []*specs.Mount {
	out := make([]*specs.Mount, 0, len(ms))
	for _, m := range ms {
		out = append(out, &specs.Mount{HostPath: m.Source, ContainerPath: m.Destination, Options: slices.Clone(m.Options)})
	}
	return out
}

// MergeResult says what Merge changed.
type MergeResult struct {
	Removed []specs.Mount // mounts taken out: /sys/devices and older copies of ours
	Added   []specs.Mount // our mounts, appended to the top-level edits
	Env     []string      // our variables in the top-level edits now
	Hooks   []specs.Hook  // our hooks in the top-level edits now
}

// Merge edits an existing spec to serve the overlay: from every edit (top
// level and each device's) it removes older copies of our mounts (any mount
// at one of our targets or from one of our sources) and, when add is set,
// the whole-/sys/devices mount that ours replace; with add it then appends
// ours to the top-level edits, which runtimes apply with any of the spec's
// devices. Everything else stays as it was, cdiVersion too: the mounts need
// nothing newer than 0.3.0, nor do hooks. Merging twice gives the same spec. Without add
// (--fail-open on an unrendered root) it only removes our mounts, and leaves
// the /sys/devices mount to serve as before. Our variables (Env) go the
// same way: older copies leave every edit, and with add the top-level
// edits get env; and our hooks: older copies (any ProcHook) leave every
// edit, and with add the top-level edits get hooks.
func Merge(s *specs.Spec, ours []Mount, env []string, add bool, hooks ...*specs.Hook) MergeResult {
	var r MergeResult
	drop := func(m *specs.Mount) bool {
		if m == nil {
			return false
		}
		if add && filepath.Clean(m.ContainerPath) == WholeDevicesDir {
			return true
		}
		return slices.ContainsFunc(ours, func(o Mount) bool {
			return filepath.Clean(m.ContainerPath) == o.Destination || filepath.Clean(m.HostPath) == o.Source
		})
	}
	prune := func(e *specs.ContainerEdits) {
		e.Mounts = slices.DeleteFunc(e.Mounts, func(m *specs.Mount) bool {
			if drop(m) {
				r.Removed = append(r.Removed, *m)
				return true
			}
			return false
		})
		if len(e.Mounts) == 0 {
			e.Mounts = nil
		}
		e.Env = mergeEnv(e.Env, nil)
		e.Hooks = slices.DeleteFunc(e.Hooks, isProcHook)
		if len(e.Hooks) == 0 {
			e.Hooks = nil
		}
	}
	prune(&s.ContainerEdits)
	for i := range s.Devices {
		prune(&s.Devices[i].ContainerEdits)
	}
	if add {
		for _, m := range cdiMounts(ours) {
			s.ContainerEdits.Mounts = append(s.ContainerEdits.Mounts, m)
			r.Added = append(r.Added, *m)
		}
		s.ContainerEdits.Env = mergeEnv(s.ContainerEdits.Env, env)
		r.Env = slices.Clone(env)
		for _, h := range cloneHooks(hooks) {
			s.ContainerEdits.Hooks = append(s.ContainerEdits.Hooks, h)
			r.Hooks = append(r.Hooks, *h)
		}
	}
	return r
}

// ReadSpec reads a CDI spec file through the CDI library, which refuses
// what a runtime would refuse: unknown fields, a bad kind, empty devices.
func ReadSpec(file string) (*specs.Spec, error) {
	s, err := cdi.ReadSpec(file, 0)
	if err != nil {
		return nil, fmt.Errorf("read CDI spec: %w", err)
	}
	return s.Spec, nil
}

// Encode writes a spec as its file's extension says: JSON for .json, YAML
// otherwise, as the CDI library reads them.
func Encode(file string, s *specs.Spec) ([]byte, error) {
	if filepath.Ext(file) == ".json" {
		b, err := json.MarshalIndent(s, "", "  ")
		return append(b, '\n'), err
	}
	var buf bytes.Buffer
	buf.WriteString("---\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(s); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteSpec replaces file with the spec, atomically: a runtime reading the
// spec directory meanwhile sees the old file or the new one, never a torn
// one. The bytes are validated by the CDI library's own reader before they
// take the file's place, so a spec it would refuse never lands. It writes
// nothing, and reports false, when the file already holds these bytes.
func WriteSpec(file string, s *specs.Spec) (bool, error) {
	data, err := Encode(file, s)
	if err != nil {
		return false, fmt.Errorf("encode CDI spec for %s: %w", file, err)
	}
	// A fresh node may not have the CDI directory (/var/run/cdi) yet.
	dir := filepath.Dir(file)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false, fmt.Errorf("write %s: create its directory %s: %w", file, dir, err)
	}
	old, err := os.ReadFile(file)
	switch {
	case err == nil && bytes.Equal(old, data):
		return false, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, err
	}
	// The pending file's name starts with a dot and does not end in .yaml
	// or .json, so runtimes watching the directory ignore it.
	pf, err := renameio.NewPendingFile(file, renameio.WithPermissions(0o644), renameio.WithExistingPermissions())
	if err != nil {
		return false, fmt.Errorf("write %s: %w", file, err)
	}
	defer pf.Cleanup()
	// Errors about the pending file name the file it stands for: its own
	// name means nothing to the user.
	named := func(err error) string { return strings.ReplaceAll(err.Error(), pf.Name(), file) }
	if _, err := pf.Write(data); err != nil {
		return false, fmt.Errorf("write %s: %s", file, named(err))
	}
	if _, err := cdi.ReadSpec(pf.Name(), 0); err != nil {
		return false, fmt.Errorf("refusing to write %s: the CDI library rejects the result: %s", file, named(err))
	}
	if err := pf.CloseAtomicallyReplace(); err != nil {
		return false, fmt.Errorf("write %s: %s", file, named(err))
	}
	return true, nil
}

// WriteStandalone writes the standalone spec of kind to file: device all
// with the mounts and variables when rendered, without them otherwise
// (--fail-open on an unrendered root). It reports whether the file
// changed. cdi --output and serve both write through it.
func WriteStandalone(file, kind string, mounts []Mount, env []string, rendered bool, hooks ...*specs.Hook) (*specs.Spec, bool, error) {
	if !rendered {
		mounts = nil
	}
	s, err := NewSpec(kind, mounts, env, hooks...)
	if err != nil {
		return nil, false, err
	}
	wrote, err := WriteSpec(file, s)
	return s, wrote, err
}

// MergeInto merges the mounts into the existing spec in file (see Merge)
// and writes it back when that changed it. On any error the file is left as
// it was; the error names the file, and the caller says why it was merging
// into it. cdi --merge-into and serve both merge through it.
func MergeInto(file string, mounts []Mount, env []string, rendered bool, hooks ...*specs.Hook) (*specs.Spec, MergeResult, bool, error) {
	s, err := ReadSpec(file)
	if err != nil {
		return nil, MergeResult{}, false, err
	}
	r := Merge(s, mounts, env, rendered, hooks...)
	wrote, err := WriteSpec(file, s)
	if err != nil {
		return nil, MergeResult{}, false, err
	}
	return s, r, wrote, nil
}
