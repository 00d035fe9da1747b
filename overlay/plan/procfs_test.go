package plan_test

import (
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// The rendered proc/modules holds, in the kernel's format, a line per
// module of the view: its holders each followed by a comma (or "-"), the
// view's refcnt, Live, the address as an unprivileged reader sees it, and
// (POE) on the NVIDIA modules alone; /proc/driver/nvidia/version names the
// version of the view's version files.
func TestProcModulesLines(t *testing.T) {
	shared := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
	for _, c := range []struct {
		profile string
		want    string
	}{
		{"hgx-h100", `nvidia 39059456 3 nvidia_modeset,nvidia_peermem,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
nvidia_peermem 16384 0 - Live 0x0000000000000000 (POE)
mlx5_core 2318336 1 mlx5_ib, Live 0x0000000000000000
mlx5_ib 475136 0 - Live 0x0000000000000000
ib_core 483328 2 mlx5_ib,nvidia_peermem, Live 0x0000000000000000
`},
		// nvml-mock's own T4 profile: no HCAs, the driver container's stack.
		{filepath.Join(shared, "t4.yaml"), `nvidia 39059456 2 nvidia_modeset,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
`},
	} {
		t.Run(filepath.Base(c.profile), func(t *testing.T) {
			m := machine(t, c.profile, "")
			p := mustPlan(t, m, plan.Options{})
			fs := files(p)
			require.Equal(t, c.want, text(t, fs, plan.ProcModulesFile))
			// The third column is the view's refcnt, module by module.
			for _, line := range strings.Split(strings.TrimSuffix(c.want, "\n"), "\n") {
				f := strings.Fields(line)
				require.Equal(t, f[2]+"\n", text(t, fs, plan.ModulesDir+"/"+f[0]+"/refcnt"), line)
			}
			require.Equal(t, "NVRM version: NVIDIA UNIX x86_64 Kernel Module  "+m.NVIDIAVersion()+"  Tue Oct 14 22:38:19 UTC 2025\n"+
				"GCC version:  gcc version 12.2.0 (Debian 12.2.0-14+deb12u1)\n", text(t, fs, plan.NVIDIAVersionFile))
		})
	}
}

// The node's own lines come first, as read; a node line of one of our
// names gives way to ours, as in the module view. A kernel without
// loadable modules has no /proc/modules: then only ours.
func TestProcModulesNodeLines(t *testing.T) {
	node := fstest.MapFS{"modules": {Data: []byte(
		"overlay 151552 2 - Live 0x0000000000000000\n" +
			"nvidia 62754816 12 nvidia_uvm,nvidia_modeset, Live 0x0000000000000000 (POE)\n" +
			"ext4 1028096 1 - Live 0x0000000000000000\n")}}
	lines, err := plan.ReadHostProcModules(node)
	require.NoError(t, err)
	require.Len(t, lines, 3)
	p := mustPlan(t, machine(t, "t4-vm", ""), plan.Options{HostProcModules: lines})
	require.Equal(t, `overlay 151552 2 - Live 0x0000000000000000
ext4 1028096 1 - Live 0x0000000000000000
nvidia 39059456 2 nvidia_modeset,nvidia_uvm, Live 0x0000000000000000 (POE)
nvidia_uvm 1507328 0 - Live 0x0000000000000000 (POE)
nvidia_modeset 1314816 0 - Live 0x0000000000000000 (POE)
`, text(t, files(p), plan.ProcModulesFile))

	none, err := plan.ReadHostProcModules(fstest.MapFS{})
	require.NoError(t, err)
	require.Nil(t, none)
}

// A node line no reader could parse is refused in one line naming the
// file, the field and the value, at read and at plan.
func TestProcModulesBadNodeLine(t *testing.T) {
	for _, c := range []struct{ line, want string }{
		{"ext4 big 1 - Live 0x0000000000000000", `node /proc/modules: line "ext4 big 1 - Live 0x0000000000000000": size: value "big": want a decimal number`},
		{"ext/4 1028096 1 - Live 0x0000000000000000", `node /proc/modules: line "ext/4 1028096 1 - Live 0x0000000000000000": name: value "ext/4": not a module name (letters, digits, '_', '-' and '.')`},
		{"ext4 1028096 x - Live 0x0000000000000000", `node /proc/modules: line "ext4 1028096 x - Live 0x0000000000000000": refcnt: value "x": want a decimal number or -`},
		{"ext4 1028096", `node /proc/modules: line "ext4 1028096": fields: value "2": want at least name, size, refcnt, holders, state and address`},
	} {
		_, err := plan.ReadHostProcModules(fstest.MapFS{"modules": {Data: []byte("overlay 151552 2 - Live 0x0000000000000000\n" + c.line + "\n")}})
		require.EqualError(t, err, c.want)
		require.NotContains(t, err.Error(), "\n")
		_, err = plan.New(machine(t, "t4-vm", ""), plan.Options{HostProcModules: []string{c.line}})
		require.ErrorContains(t, err, c.want)
	}
}
