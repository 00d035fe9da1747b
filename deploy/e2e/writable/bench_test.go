package writable_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"
	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// The benchmarks' child modes: each runs its work n times in the served
// namespace and prints the time one took, so that the figure is the work's
// own and not a process start's.
const (
	nvpciChild    = "nvpci"    // go-nvlib's whole-bus scan, as GFD and the device plugin make it
	readChild     = "read"     // compat's every row (go-nvlib, deviceattribute)
	bindLoopChild = "bindloop" // the first GPU unbound from nvidia and bound back, by plain writes
)

// timing is what a timing child prints.
type timing struct {
	NsPerOp float64 `json:"ns_per_op"`
}

func timeChild(mode string, m *profile.Machine, n int) int {
	gpu := m.GPUs()[0].Address.String()
	write := func(file, data string) {
		if err := os.WriteFile(file, []byte(data), 0); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
	ops := n
	start := time.Now()
	for range n {
		switch mode {
		case nvpciChild:
			if _, err := nvpci.New().GetAllDevices(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
		case readChild:
			compat.Run(m, compat.KernelSysfs)
		case bindLoopChild:
			write("/sys/bus/pci/drivers/nvidia/unbind", gpu)
			write("/sys/bus/pci/drivers/nvidia/bind", gpu)
		}
	}
	if mode == bindLoopChild {
		ops = 2 * n
	}
	if err := json.NewEncoder(os.Stdout).Encode(timing{NsPerOp: float64(time.Since(start).Nanoseconds()) / float64(ops)}); err != nil {
		return 1
	}
	return 0
}

// benchProfile is a large machine: 8 GPUs behind PCIe switches, NVSwitches
// and an HCA per GPU.
const benchProfile = "hgx-h100"

// timed runs a timing child b.N times over and reports its figure as the
// benchmark's ns/op.
func timed(b *testing.B, served hosttest.Served, mode string) {
	cmd := served.Reexec(b, mode, "--", "x", fmt.Sprint(b.N))
	out, err := cmd.Output()
	require.NoError(b, err, "%s child", mode)
	var tm timing
	require.NoError(b, json.Unmarshal(out, &tm))
	b.ReportMetric(tm.NsPerOp, "ns/op")
}

// BenchmarkReaders reads the whole bus with go-nvlib, and runs compat's
// every row, through the read-only tree and through the writable view of
// the same profile: the writable mode's cost to readers is the ratio.
func BenchmarkReaders(b *testing.B) {
	overlaytest.RequireRoot(b, "nsenter")
	overlaytest.RequireFUSE(b)
	for _, mode := range []string{nvpciChild, readChild} {
		b.Run(mode+"/read-only", func(b *testing.B) {
			timed(b, hosttest.Served{Root: renderReadOnly(b, benchProfile)}, mode)
		})
		b.Run(mode+"/writable", func(b *testing.B) {
			srv := start(b, benchProfile, filepath.Join(b.TempDir(), "root"), memDir(b))
			timed(b, srv.served(b), mode)
		})
	}
}

// BenchmarkBind is one write(2) to a driver's bind or unbind file through
// the writable view, the tree in memory as serve keeps it by default:
// from the writer's call to its return, the tree already changed.
func BenchmarkBind(b *testing.B) {
	overlaytest.RequireRoot(b, "nsenter")
	overlaytest.RequireFUSE(b)
	srv := start(b, benchProfile, filepath.Join(b.TempDir(), "root"), memDir(b))
	timed(b, srv.served(b), bindLoopChild)
}

// memDir is a directory in memory for serve's tree, as /run is on most
// hosts (not on this CI machine, whose /run is on disk).
func memDir(b *testing.B) string {
	dir, err := os.MkdirTemp("/dev/shm", "writable-bench-")
	require.NoError(b, err)
	b.Cleanup(func() { _ = os.RemoveAll(dir) })
	return filepath.Join(dir, "tree")
}
