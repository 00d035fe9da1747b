package writable_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	specs "tags.cncf.io/container-device-interface/specs-go"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// kubevirtRegisters is the line kubevirt-gpu-device-plugin logs for each
// GPU it found bound to a VFIO driver, before it starts serving the
// kubelet (which this namespace has none of: it then logs its error).
var kubevirtRegisters = regexp.MustCompile(`Registering device: ID=(\S+),`)

// TestKubevirtListsABoundGPU: NVIDIA's kubevirt-gpu-device-plugin, when
// supplied, lists no GPU of a node whose GPUs are all on nvidia (the
// negative control), and every GPU once nvpassthrough has bound them to
// vfio-pci by writes.
func TestKubevirtListsABoundGPU(t *testing.T) {
	overlaytest.RequireRoot(t, "nsenter", "timeout")
	overlaytest.RequireFUSE(t)
	const row = "kubevirt-gpu-device-plugin lists the GPUs bound to vfio-pci by writes"
	plugin, ok := programs.NeedSupplied(t, programs.KubevirtGPUDevicePlugin)
	if !ok {
		t.Log(programs.NotRun(row, programs.KubevirtGPUDevicePlugin))
		return
	}
	m := machine(t)
	srv := start(t, repoProfile(t), filepath.Join(t.TempDir(), "root"), filepath.Join(t.TempDir(), "tree"))
	served := srv.served(t)
	// It names resources from pci.ids, where the GPU Operator's image has
	// one; Debian's stands in.
	served.Spec = append(served.Spec, &specs.Mount{HostPath: programs.HostPCIIDs, ContainerPath: "/usr/pci.ids", Options: []string{"ro", "bind"}})
	listed := func() []string {
		// It serves the kubelet until killed; what it found is logged
		// before its "Device Map" line, which ends the wait (30 s at most).
		out, _, _ := served.Shell(fmt.Sprintf(`log=$(mktemp); %s >"$log" 2>&1 & pid=$!
for i in $(seq 600); do grep -q "Device Map" "$log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.05; done
kill $pid 2>/dev/null || true; wait $pid || true; cat "$log"; rm -f "$log"`, plugin))
		var ids []string
		for _, m := range kubevirtRegisters.FindAllStringSubmatch(out, -1) {
			ids = append(ids, m[1])
		}
		slices.Sort(ids)
		t.Logf("kubevirt-gpu-device-plugin registers %v", ids)
		return ids
	}
	require.Empty(t, listed(), "every GPU on nvidia: nothing to pass through")
	requireOK(t, report(t, served, bindChild, profile.DriverNVIDIA, profile.DriverVFIO), "to vfio-pci")
	var want []string
	for _, g := range m.GPUs() {
		want = append(want, g.Address.String())
	}
	require.Equal(t, want, listed(), row)
}
