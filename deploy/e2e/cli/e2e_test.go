package cli

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// section returns the lines a script printed between "== name" and the next
// "== " header.
func section(out, name string) string {
	_, rest, ok := strings.Cut(out, "== "+name+"\n")
	if !ok {
		return ""
	}
	body, _, _ := strings.Cut(rest, "\n== ")
	return body
}

// TestKernelPath mounts each rendered tree where a served container sees it
// and runs the real consumers at /sys: compat (deviceattribute, go-nvlib)
// and lspci, and checks that the kernel's own sysfs is still there.
func TestKernelPath(t *testing.T) {
	overlaytest.RequireRoot(t, "lspci")
	bin := binaries.Binary(t)
	profiles := append(shipped.Names(), overlaytest.RepoProfiles(t)...)
	for _, prof := range profiles {
		t.Run(filepath.Base(prof), func(t *testing.T) {
			t.Parallel() // each in its own mount namespace
			checkKernelPath(t, bin, prof)
		})
	}
	// Only nvml-mock's own profiles need ../shared; without it this part
	// skips and the rest still runs.
	t.Run("shared", func(t *testing.T) {
		shared, _ := filepath.Glob(filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), "*.yaml"))
		for _, prof := range shared {
			t.Run(filepath.Base(prof), func(t *testing.T) {
				t.Parallel()
				checkKernelPath(t, bin, prof)
			})
		}
	})
}

func checkKernelPath(t *testing.T, bin, prof string) {
	root := filepath.Join(t.TempDir(), "overlay")
	out, err := exec.Command(bin, "render", "--profile", prof, "--root", root).CombinedOutput()
	require.NoError(t, err, "%s", out)
	p, err := overlay.Plan(overlay.Options{Profile: prof})
	require.NoError(t, err)

	script := strings.Join([]string{
		"echo '== compat'", bin + " compat --sysfs /sys --format json || true",
		"echo '== lspci-n'", "lspci -Dn", "echo \"exit $?\"",
		"echo '== lspci-tv'", "lspci -tv >/dev/null", "echo \"exit $?\"",
		"echo '== cpu'", "stat -f -c %t /sys/devices/system/cpu", "cat /sys/devices/system/cpu/online",
		"echo '== end'",
	}, "\n")
	out2 := hosttest.Served{Root: root}.Run(t, "sh", "-c", script)

	var r compat.Report
	require.NoError(t, json.Unmarshal([]byte(section(out2, "compat")), &r), out2)
	for _, f := range r.Failures() {
		t.Errorf("compat at /sys: %s %s: %s", f.Check, f.Device, f.Detail)
	}
	require.Equal(t, compat.KernelSysfs, r.Sysfs)
	require.NotEmpty(t, r.Results)

	// lspci lists every node of the tree, and exactly the profile's
	// GPUs as 3D controllers.
	lspci := section(out2, "lspci-n")
	require.True(t, strings.HasSuffix(strings.TrimSpace(lspci), "exit 0"), lspci)
	var gpus, all []string
	for _, line := range strings.Split(strings.TrimSpace(lspci), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] == "exit" {
			continue
		}
		all = append(all, f[0])
		if f[1] == "0302:" {
			gpus = append(gpus, f[0])
		}
	}
	var wantGPUs, wantAll []string
	for _, d := range p.Machine.GPUs() {
		wantGPUs = append(wantGPUs, d.Address.String())
	}
	for _, n := range p.Tree.Nodes() {
		wantAll = append(wantAll, n.Address.String())
	}
	slices.Sort(wantAll)
	require.Equal(t, wantGPUs, gpus)
	require.Equal(t, wantAll, all)
	require.Equal(t, "exit 0", strings.TrimSpace(section(out2, "lspci-tv")))

	// The kernel's CPU topology is untouched.
	cpu := strings.Fields(section(out2, "cpu"))
	require.Equal(t, "62656572", cpu[0], "sysfs magic: /sys/devices/system/cpu is still the kernel's")
	require.Regexp(t, `^[0-9]`, cpu[1])
}
