// Package cdispec holds what both delivery paths (CDI and NRI) share: the
// set of bind mounts that serve a rendered overlay and the CDI device edits
// built from it, written as a standalone CDI spec, merged into an existing
// CDI spec, or handed as a plain list to an NRI plugin. Every channel takes
// its mounts from Mounts, so they cannot drift apart.
package cdispec

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// Mount is one bind mount into a container.
type Mount struct {
	Source      string   `json:"source"`
	Destination string   `json:"destination"`
	Options     []string `json:"options"`
}

// mountOptions are the options of every mount: read-only, and nothing on
// the mock tree may act as a set-uid file or a device node.
func mountOptions() []string { return []string{"ro", "nosuid", "nodev", "bind"} }

// Mounts is the one definition of the mount set: the overlay root at the
// container root, its links directory at /sys/bus/pci/devices and at every
// alsoAt target (each exactly four levels deep, like
// /host-sys/bus/pci/devices, where node-feature-discovery looks), and the
// module view (docs/design/modules.md) at /sys/module, and at <P>/module
// for each alsoAt target <P>/bus/pci/devices (a node's /sys seen at <P>),
// with the node's own /sys/module read-only at the container root's
// plan.HostModulesDir, where the view's links to the node's modules lead:
// the view and that mount go together, or those links would lead back to
// the view itself.
func Mounts(root, containerRoot string, alsoAt []string) ([]Mount, error) {
	return mounts(root, containerRoot, alsoAt, plan.DefaultHostSysfs)
}

// mounts is Mounts with the node's sysfs at hostSysfs.
func mounts(root, containerRoot string, alsoAt []string, hostSysfs string) ([]Mount, error) {
	if err := writer.CheckRoot(root); err != nil {
		return nil, err
	}
	containerRoot = cmp.Or(containerRoot, plan.DefaultContainerRoot)
	if err := plan.ValidateContainerRoot(containerRoot); err != nil {
		return nil, err
	}
	links := path.Join(root, plan.LinksDir)
	out := []Mount{
		{Source: root, Destination: containerRoot, Options: mountOptions()},
		{Source: links, Destination: sysfs.KernelLinksDir, Options: mountOptions()},
	}
	modules := []string{path.Join(sysfs.Mount, sysfs.ModulesDir)}
	for _, t := range alsoAt {
		if err := CheckLinksTarget(t); err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(m Mount) bool { return m.Destination == t }) {
			return nil, &TargetError{Target: t, Err: errors.New("already a mount target")}
		}
		if t == containerRoot || strings.HasPrefix(t, containerRoot+"/") {
			return nil, &TargetError{Target: t, Err: fmt.Errorf("inside the container root %s", containerRoot)}
		}
		out = append(out, Mount{Source: links, Destination: t, Options: mountOptions()})
		if sys, ok := strings.CutSuffix(t, "/"+sysfs.LinksDir); ok && sys != sysfs.Mount {
			modules = append(modules, path.Join(sys, sysfs.ModulesDir))
		}
	}
	for _, m := range modules {
		out = append(out, Mount{Source: path.Join(root, plan.ModulesDir), Destination: m, Options: mountOptions()})
	}
	return append(out, Mount{Source: path.Join(hostSysfs, sysfs.ModulesDir), Destination: path.Join(containerRoot, plan.HostModulesDir), Options: mountOptions()}), nil
}

// WritableMounts is the mount set of the writable mode (serve --writable),
// where root is the FUSE view of the tree: Mounts, with the overlay root
// writable so that writes reach the FUSE server (it refuses every write but
// the kernel's writable attributes), and three more, since binding names
// paths outside /sys/bus/pci/devices: the tree's drivers directory at
// /sys/bus/pci/drivers and its drivers_probe at /sys/bus/pci/drivers_probe,
// both writable; and the node's own /sys/bus/pci/drivers and /sys/devices
// (from hostSysfs, default /sys), read-only under the container root's
// plan.HostSysDir, where the tree's links to the node's own drivers lead.
// The rest of /sys stays the kernel's. With the node's kernel release,
// the tree's plan.ModulesAlias stands in for its modules.alias, which
// go-nvlib reads to bind a GPU to vfio-pci.
func WritableMounts(root, containerRoot string, alsoAt []string, hostSysfs, release string) ([]Mount, error) {
	hostSysfs = cmp.Or(hostSysfs, plan.DefaultHostSysfs)
	out, err := mounts(root, containerRoot, alsoAt, hostSysfs)
	if err != nil {
		return nil, err
	}
	containerRoot = cmp.Or(containerRoot, plan.DefaultContainerRoot)
	rw := []string{"rw", "nosuid", "nodev", "bind"}
	out[0].Options = rw
	host := path.Join(containerRoot, plan.HostSysDir)
	if release != "" {
		if strings.ContainsAny(release, "/\n") || release == "." || release == ".." {
			return nil, fmt.Errorf("kernel release %q: not a directory name of /lib/modules", release)
		}
		out = append(out, Mount{Source: path.Join(root, plan.ModulesAlias), Destination: path.Join("/lib/modules", release, "modules.alias"), Options: mountOptions()})
	}
	return append(out,
		Mount{Source: path.Join(root, plan.DriversDir), Destination: path.Join(sysfs.Mount, "bus/pci/drivers"), Options: rw},
		Mount{Source: path.Join(root, plan.DriversProbe), Destination: path.Join(sysfs.Mount, "bus/pci/drivers_probe"), Options: rw},
		Mount{Source: path.Join(hostSysfs, "bus/pci/drivers"), Destination: path.Join(host, "bus/pci/drivers"), Options: mountOptions()},
		Mount{Source: path.Join(hostSysfs, "devices"), Destination: path.Join(host, "devices"), Options: mountOptions()},
	), nil
}

// TargetError refuses an extra place to mount the links directory at. It
// names the target and not where it came from: the caller adds that (the
// command line's --also-at).
type TargetError struct {
	Target string
	Err    error
}

func (e *TargetError) Error() string { return fmt.Sprintf("links target %q: %v", e.Target, e.Err) }

func (e *TargetError) Unwrap() error { return e.Err }

// CheckLinksTarget refuses a place to mount the links directory where its
// links would not resolve. A bridge's link climbs exactly four levels
// (../../../../opt/nvml-mock/...) to reach the container root, so the
// directory must sit four levels below it: deeper, the links land inside
// some other directory; shallower, they would lean on .. stopping at /.
// Its error is a *TargetError.
func CheckLinksTarget(t string) error {
	if err := plan.CheckAbsolutePath(t); err != nil {
		return &TargetError{Target: t, Err: err}
	}
	if depth := strings.Count(t, "/"); depth != sysfs.LinksDepth {
		return &TargetError{Target: t, Err: fmt.Errorf("is %d levels deep, but the links climb exactly %d levels (%s) to the container root, so it must be %d levels deep, like /host-sys/bus/pci/devices",
			depth, sysfs.LinksDepth, sysfs.Up(sysfs.LinksDepth), sysfs.LinksDepth)}
	}
	return nil
}

// CheckRendered is the gate. A runtime that gets a bind mount whose source
// is missing fails to create the container, and a half-written tree
// misleads it, so mounts are handed out only when root holds a complete
// render, vouched for by the writer's completion marker.
func CheckRendered(root fs.FS, name string) error {
	if _, err := writer.ReadMarker(root); err != nil {
		return fmt.Errorf("%s holds no complete render (%w)", name, err)
	}
	return nil
}

// ServedContainerRoot is the container root to mount the overlay at: the
// one the render recorded in its completion marker, since the tree's links
// point there and nowhere else. want, when given, must agree with it (the
// error names want, and the caller says where want came from); it is used
// as is only when root holds no marker that records one.
func ServedContainerRoot(root fs.FS, name, want string) (string, error) {
	m, err := writer.ReadMarker(root)
	switch {
	case err != nil || m.ContainerRoot == "":
		if want == "" {
			return plan.DefaultContainerRoot, nil
		}
		return want, nil
	case want != "" && want != m.ContainerRoot:
		return "", fmt.Errorf("%s: the render at %s was made for %s, and its links point there", want, name, m.ContainerRoot)
	}
	return m.ContainerRoot, nil
}
