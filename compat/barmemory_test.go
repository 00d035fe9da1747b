package compat_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func rows(r *compat.Report, check string) []compat.Result {
	var out []compat.Result
	for _, x := range r.Results {
		if x.Check == check {
			out = append(out, x)
		}
	}
	return out
}

// TestBARMemory checks that go-nvlib's GetTotalAddressableMemory reports
// each built-in profile's BAR sizes, and that a wrong BAR is caught.
func TestBARMemory(t *testing.T) {
	tests := []struct {
		profile string
		detail  string // of the first GPU
	}{
		{"dgx-a100", "BAR1 64 GiB, 64-bit total 65568 MiB"},
		{"hgx-h100", "BAR1 128 GiB, 64-bit total 131120 MiB"},
		{"gb200-tray", "BAR1 256 GiB, 64-bit total 262192 MiB"},
		{"t4-vm", "BAR1 256 MiB, 64-bit total 288 MiB"},
	}
	for _, tc := range tests {
		t.Run(tc.profile, func(t *testing.T) {
			t.Parallel()
			r, _, p := sharedReport(t, tc.profile)
			require.True(t, r.OK(), "%+v", r.Failures())
			m := p.Machine
			bars := rows(r, compat.BARMemory)
			require.Len(t, bars, len(m.GPUs()))
			require.Equal(t, tc.detail, bars[0].Detail)
			gpu := m.GPUs()[0]

			// Shrink BAR1 to 1 MiB in the resource file of a tree of its
			// own: the row turns red.
			root, _ := render(t, tc.profile)
			res := filepath.Join(root, plan.LinksDir, gpu.Address.String(), "resource")
			data, err := os.ReadFile(res)
			require.NoError(t, err)
			lines := strings.Split(string(data), "\n")
			bar := 1
			if boards.BARLayoutOf(gpu.Name, gpu.DeviceID) == boards.Hopper {
				bar = 2
			}
			f := strings.Fields(lines[bar])
			start, err := strconv.ParseUint(f[0], 0, 64)
			require.NoError(t, err)
			lines[bar] = fmt.Sprintf("%s 0x%016x %s", f[0], start+1<<20-1, f[2])
			require.NoError(t, os.Remove(res))
			require.NoError(t, os.WriteFile(res, []byte(strings.Join(lines, "\n")), 0o644))
			r = compat.Run(m, filepath.Join(root, "sys"))
			require.False(t, rows(r, compat.BARMemory)[0].OK, "%+v", rows(r, compat.BARMemory)[0])
		})
	}
}
