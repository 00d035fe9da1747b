package mountns_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
	"github.com/nvml-mock/nvml-mock-sysfs/verify"
)

// TestServedNodeKeepsItsDevices renders nvml-mock's own h100 profile with
// the deploy defaults (--host-devices merge, from this machine's /sys),
// serves it in a private mount namespace as a container gets it, and runs
// the installed binary's verify there, with NVML's profile: every PCI
// device the kernel's /sys/devices shows is still listed, NVML's GPUs are
// the sysfs's, and lspci lists the node's devices and the mock GPUs. The
// negative control renders without merging: verify names the node's
// devices it lost.
func TestServedNodeKeepsItsDevices(t *testing.T) {
	requireNamespace(t)
	host := hostDevices(t)
	before, err := exec.Command("lspci", "-D", "-n").Output()
	require.NoError(t, err)
	nodeLines := lines(string(before))
	require.Len(t, nodeLines, len(host))
	nvmlProfile := filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "h100.yaml")
	bin := hosttest.BuildBinary(t)

	served := func(t *testing.T, hostDevices overlay.HostDevices) (*compat.Report, string, *plan.Plan) {
		t.Helper()
		root := filepath.Join(t.TempDir(), "nvml-mock")
		p, _, err := overlay.Render(overlay.Options{Profile: nvmlProfile, Root: root, HostDevices: hostDevices, HostSysfs: "/sys", Binary: bin, Writer: writer.Options{SkipSync: true}})
		require.NoError(t, err)
		out, stderr, err := hosttest.Served{Root: root}.Shell(
			plan.DefaultContainerRoot + "/bin/nvml-mock-sysfs verify --nvml-profile " + nvmlProfile + " --format json || true\necho ==lspci==\nlspci -D -n\n")
		require.NoError(t, err, "%s%s", out, stderr)
		report, listed, ok := strings.Cut(out, "==lspci==\n")
		require.True(t, ok, out)
		var r compat.Report
		require.NoError(t, json.Unmarshal([]byte(report), &r), report)
		return &r, listed, p
	}
	row := func(t *testing.T, r *compat.Report, name string) compat.Result {
		t.Helper()
		for _, x := range r.Results {
			if x.Check == name {
				return x
			}
		}
		t.Fatalf("verify has no %q row", name)
		return compat.Result{}
	}

	t.Run("merge", func(t *testing.T) {
		t.Parallel()
		r, listed, p := served(t, overlay.HostDevicesMerge)
		require.True(t, r.OK(), "%+v", r.Failures())
		require.Equal(t, fmt.Sprintf("all %d PCI devices under /sys/devices/pci* are listed, each by a link to its own directory", len(host)), row(t, r, verify.NodeDevices).Detail)
		require.True(t, row(t, r, compat.NVMLAgreement).OK)
		for _, l := range nodeLines {
			require.Contains(t, listed, l+"\n", "lspci lists the node's %s with its own ids", l)
		}
		for _, g := range p.Machine.GPUs() {
			require.Contains(t, listed, g.Address.String()+" 0302: 10de:2330", "lspci lists the mock GPU %s", g.Address)
		}
		require.Len(t, strings.Split(strings.TrimSpace(listed), "\n"), len(host)+len(p.Tree.Nodes()))
		t.Logf("served with merge: lspci lists %d devices: the node's %d and %d mock (%d GPUs); %s", len(host)+len(p.Tree.Nodes()), len(host), len(p.Tree.Nodes()), len(p.Machine.GPUs()), row(t, r, verify.NodeDevices).Detail)
	})
	t.Run("none", func(t *testing.T) {
		t.Parallel()
		r, listed, _ := served(t, overlay.HostDevicesNone)
		node := row(t, r, verify.NodeDevices)
		require.False(t, node.OK)
		for _, bdf := range host {
			require.Contains(t, node.Detail, bdf, "verify names the lost %s", bdf)
		}
		for _, l := range nodeLines {
			require.NotContains(t, listed, l+"\n", "lspci lost the node's %s", l)
		}
		require.Equal(t, []compat.Result{node}, r.Failures(), "only the node's devices are wrong")
		t.Logf("served without merge: %s", node.Detail)
	})
}
