// Package deploy delivers a rendered overlay to containers: the set of bind
// mounts that serve it, as a standalone CDI spec, merged into an existing
// CDI spec, or as a plain list for an NRI plugin. Every channel takes its
// mounts from Mounts, so they cannot drift apart.
package deploy

import (
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// KernelLinksDir is where consumers list PCI devices in a container.
const KernelLinksDir = "/sys/bus/pci/devices"

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
// container root, and its links directory at /sys/bus/pci/devices and at
// every alsoAt target (each exactly four levels deep, like
// /host-sys/bus/pci/devices, where node-feature-discovery looks).
func Mounts(root, containerRoot string, alsoAt []string) ([]Mount, error) {
	if err := writer.CheckRoot(root); err != nil {
		return nil, err
	}
	if containerRoot == "" {
		containerRoot = plan.DefaultContainerRoot
	}
	if err := plan.ValidateContainerRoot(containerRoot); err != nil {
		return nil, err
	}
	links := path.Join(root, plan.LinksDir)
	out := []Mount{
		{Source: root, Destination: containerRoot, Options: mountOptions()},
		{Source: links, Destination: KernelLinksDir, Options: mountOptions()},
	}
	for _, t := range alsoAt {
		if err := CheckLinksTarget(t); err != nil {
			return nil, err
		}
		if slices.ContainsFunc(out, func(m Mount) bool { return m.Destination == t }) {
			return nil, fmt.Errorf("--also-at %q: already a mount target", t)
		}
		if t == containerRoot || strings.HasPrefix(t, containerRoot+"/") {
			return nil, fmt.Errorf("--also-at %q: inside the container root %s", t, containerRoot)
		}
		out = append(out, Mount{Source: links, Destination: t, Options: mountOptions()})
	}
	return out, nil
}

// CheckLinksTarget refuses a place to mount the links directory where its
// links would not resolve. A bridge's link climbs exactly four levels
// (../../../../opt/nvml-mock/...) to reach the container root, so the
// directory must sit four levels below it: deeper, the links land inside
// some other directory; shallower, they would lean on .. stopping at /.
func CheckLinksTarget(t string) error {
	switch {
	case !path.IsAbs(t):
		return fmt.Errorf("--also-at %q: must be an absolute path", t)
	case path.Clean(t) != t:
		return fmt.Errorf("--also-at %q: must be clean (no trailing slash, . or ..)", t)
	}
	if depth := strings.Count(t, "/"); depth != plan.LinksDepth {
		return fmt.Errorf("--also-at %q: is %d levels deep, but the links climb exactly %d levels (../../../../) to the container root, so it must be %d levels deep, like /host-sys/bus/pci/devices", t, depth, plan.LinksDepth, plan.LinksDepth)
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
// point there and nowhere else. flagValue, when given, must agree with it;
// it is used as is only when root holds no marker that records one.
func ServedContainerRoot(root fs.FS, name, flagValue string) (string, error) {
	m, err := writer.ReadMarker(root)
	switch {
	case err != nil || m.ContainerRoot == "":
		if flagValue == "" {
			return plan.DefaultContainerRoot, nil
		}
		return flagValue, nil
	case flagValue != "" && flagValue != m.ContainerRoot:
		return "", fmt.Errorf("--container-root %s: the render at %s was made for %s, and its links point there; drop the flag, or render again with --container-root %s", flagValue, name, m.ContainerRoot, flagValue)
	}
	return m.ContainerRoot, nil
}
