package compat

import (
	"fmt"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// ServedLinks is the consumer name of the host-side check that the links
// resolve where a served container mounts the overlay.
const ServedLinks = "links at the container root"

// CheckServedLinks checks, from the host, what a served container will see:
// with the overlay root mounted at containerRoot and its links directory at
// /sys/bus/pci/devices, every entry of the links directory must resolve to
// a directory of the overlay's sys/devices. On the host the loop link makes
// the links resolve whatever container root they were made for, so the
// consumers' rows alone cannot tell a tree served at the wrong place. An
// entry that leaves the mounts for the kernel's /sys/devices is a host
// device (render --host-devices merge) and is the kernel's to resolve.
func CheckServedLinks(root, containerRoot string) Result {
	linksDir := path.Join(root, plan.LinksDir)
	entries, err := os.ReadDir(linksDir)
	if err != nil {
		return Result{Check: ServedLinks, Device: "*", Detail: err.Error()}
	}
	ns := servedNamespace{mounts: [][2]string{
		{sysfs.KernelLinksDir, linksDir},
		{containerRoot, root},
	}}
	devices := path.Join(containerRoot, "sys/devices") + "/"
	var bad []string
	for _, e := range entries {
		at := sysfs.KernelLinksDir + "/" + e.Name()
		got, err := ns.resolve(at)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", e.Name(), err))
		case strings.HasPrefix(got, devices):
		case strings.HasPrefix(got, "/sys/devices/"):
			// A host device: the kernel's own directory.
		default:
			bad = append(bad, fmt.Sprintf("%s resolves to %s, outside %s", e.Name(), got, devices))
		}
	}
	if len(bad) > 0 {
		return Result{Check: ServedLinks, Device: "*", Detail: fmt.Sprintf("with the overlay at %s, %d of %d entries do not resolve into it: %s", containerRoot, len(bad), len(entries), strings.Join(bad, "; "))}
	}
	return Result{Check: ServedLinks, Device: "*", OK: true, Detail: fmt.Sprintf("with the overlay at %s, all %d entries resolve into %s", containerRoot, len(entries), devices)}
}

// servedNamespace maps a container's paths to the host's through bind
// mounts (container path, host path), the most specific first.
type servedNamespace struct {
	mounts [][2]string
}

// host returns the host path behind a container path, or false when no
// mount covers it.
func (ns servedNamespace) host(p string) (string, bool) {
	for _, m := range ns.mounts {
		if p == m[0] || strings.HasPrefix(p, m[0]+"/") {
			return m[1] + strings.TrimPrefix(p, m[0]), true
		}
	}
	return "", false
}

// resolve follows p physically, component by component, as the kernel
// would in the container: each symlink's text is read on the host and
// spliced in, and ".." climbs from where the walk really is. It stops, and
// returns the path reached, when the walk leaves the mounts.
func (ns servedNamespace) resolve(p string) (string, error) {
	w := sysfs.NewWalk(strings.TrimPrefix(p, "/"))
	cur := "/"
	for c, more := w.Next(); more; c, more = w.Next() {
		if c == ".." {
			cur = path.Dir(cur)
			continue
		}
		next := path.Join(cur, c)
		h, mounted := ns.host(next)
		if !mounted {
			cur = next
			if !ns.above(cur) {
				// Left the mounts: the rest is another file system's.
				return path.Join(append([]string{cur}, w.Rest()...)...), nil
			}
			continue
		}
		info, err := os.Lstat(h)
		if err != nil {
			return "", fmt.Errorf("%s: %w", next, err)
		}
		if info.Mode()&os.ModeSymlink == 0 {
			cur = next
			continue
		}
		target, err := os.Readlink(h)
		if err != nil {
			return "", err
		}
		if !w.Follow(target) {
			return "", fmt.Errorf("%s: more than %d links", p, sysfs.MaxFollows)
		}
		if path.IsAbs(target) {
			cur = "/"
		}
	}
	return cur, nil
}

// above reports whether p is a directory on the way to a mount point, such
// as /sys or /opt, which the walk passes through.
func (ns servedNamespace) above(p string) bool {
	return slices.ContainsFunc(ns.mounts, func(m [2]string) bool {
		return p == "/" || strings.HasPrefix(m[0], p+"/")
	})
}
