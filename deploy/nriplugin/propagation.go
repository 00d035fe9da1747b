package nriplugin

import (
	"path"
	"slices"
	"strings"

	"github.com/containerd/nri/pkg/api"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
)

// Slaved decides which of a served container's own mounts must lose their
// shared propagation before ours are added, and returns them as they are
// re-added: the same source, type and options, with "rslave" in place of
// every shared option. A mount with shared propagation (a pod's
// Bidirectional volume, which the CRI hands the runtime as an rbind with
// "rshared"; the NVIDIA DRA driver's chart mounts the node's /sys so with
// PassthroughSupport) at one of our destinations or above one (/, /sys,
// /sys/bus, ...) would carry every mount the runtime makes beneath it
// (our links at /sys/bus/pci/devices, the view at /sys/module) to its
// peers: the node's own /sys. As a slave it still sees what the node
// mounts there; nothing mounted in the container goes back.
//
// ours are the destinations of the mounts we add. A mount below all of
// ours, or beside them, is left as it is: nothing of ours lands beneath it.
func Slaved(mounts []*api.Mount, ours []string) []*api.Mount {
	var out []*api.Mount
	for _, m := range mounts {
		if !cdispec.SharedPropagation(m.GetOptions()) {
			continue
		}
		dst := path.Clean(m.GetDestination())
		if !slices.ContainsFunc(ours, func(o string) bool { return beneath(path.Clean(o), dst) }) {
			continue
		}
		opts := make([]string, 0, len(m.GetOptions()))
		for _, o := range m.GetOptions() {
			switch o {
			case "shared", "rshared":
				if !slices.Contains(opts, "rslave") {
					opts = append(opts, "rslave")
				}
			default:
				opts = append(opts, o)
			}
		}
		out = append(out, &api.Mount{Destination: m.GetDestination(), Source: m.GetSource(), Type: m.GetType(), Options: opts})
	}
	return out
}

// beneath reports whether p is dir or lies under it (both clean).
func beneath(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}
