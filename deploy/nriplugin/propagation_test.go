package nriplugin

import (
	"testing"

	"github.com/containerd/nri/pkg/api"
	"github.com/stretchr/testify/require"
)

// TestSlaved: a container's shared mount at one of our destinations or
// above one comes back rslave, with its source, type and other options as
// they were; any other mount is left alone.
func TestSlaved(t *testing.T) {
	ours := []string{"/opt/nvml-mock-sysfs", "/sys/bus/pci/devices", "/sys/module", "/opt/nvml-mock-sysfs/host-sys/module"}
	bind := func(src, dst string, opts ...string) *api.Mount {
		return &api.Mount{Source: src, Destination: dst, Type: "bind", Options: opts}
	}
	for _, c := range []struct {
		name  string
		mount *api.Mount
		want  *api.Mount // nil: left alone
	}{
		{"the DRA driver's Bidirectional /sys", bind("/sys", "/sys", "rbind", "rshared", "rw"), bind("/sys", "/sys", "rbind", "rslave", "rw")},
		{"shared, not recursive", bind("/sys", "/sys/", "bind", "shared"), bind("/sys", "/sys/", "bind", "rslave")},
		{"both", bind("/sys/bus", "/sys/bus", "rbind", "shared", "rshared", "ro"), bind("/sys/bus", "/sys/bus", "rbind", "rslave", "ro")},
		{"at one of ours", bind("/sys/module", "/sys/module", "rbind", "rshared"), bind("/sys/module", "/sys/module", "rbind", "rslave")},
		{"the node's / at /", bind("/", "/", "rbind", "rshared"), bind("/", "/", "rbind", "rslave")},
		{"above the container root", bind("/opt", "/opt", "rbind", "rshared"), bind("/opt", "/opt", "rbind", "rslave")},
		{"not shared", bind("/sys", "/sys", "rbind", "rprivate", "rw"), nil},
		{"HostToContainer", bind("/sys", "/sys", "rbind", "rslave", "rw"), nil},
		{"beside ours", bind("/proc", "/proc", "rbind", "rshared", "rw"), nil},
		{"a sibling with a common prefix", bind("/sys/bus/pci/dev", "/sys/bus/pci/dev", "rbind", "rshared"), nil},
		{"beneath ours", bind("/x", "/sys/bus/pci/devices/x", "rbind", "rshared"), nil},
		{"the kubelet's plugins", bind("/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins", "rbind", "rshared"), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := Slaved([]*api.Mount{c.mount}, ours)
			if c.want == nil {
				require.Empty(t, got)
				return
			}
			require.Equal(t, []*api.Mount{c.want}, got)
		})
	}
	require.Empty(t, Slaved([]*api.Mount{bind("/sys", "/sys", "rbind", "rshared")}, nil), "nothing of ours: nothing to change")
}
