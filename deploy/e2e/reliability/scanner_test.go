package reliability

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/NVIDIA/go-nvlib/pkg/nvpci"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// The reader runs as this test binary re-executed as the child
// scannerMode in a private mount namespace where hosttest.Served has
// mounted the overlay as a container has it. It scans /sys/bus/pci/devices in a loop, the kernel
// resolving every link, while the parent re-renders. Commands on stdin:
// "verify" answers one scan of the (then stable) tree; "stop" answers the
// totals and exits; "verify nvlib" also runs go-nvlib's GetGPUs, which is
// slow (it parses pci.ids for every device). Every answer is one JSON line
// on stdout.
const scannerMode = "scanner"

// scanPause is the reader's rest between scans. Without it the reader
// spins a whole core for the test's minute, which the suite's other tests
// want; with it, scans still land all through each render (about 50 a
// flip, where minScans asks 25), as a consumer polling the links directory
// would. Measured: 10117 scans in 200 flips, 86 s of CPU instead of 110.
const scanPause = 2 * time.Millisecond

// nvlibEvery runs go-nvlib's own scan every so many raw scans.
const nvlibEvery = 25

// maxSamples bounds the examples kept of go-nvlib's failures.
const maxSamples = linkscan.MaxSamples

type scannerStats struct {
	linkscan.Totals
	// go-nvlib's GetAllDevices at the kernel path, during flips.
	NvlibScans int `json:"nvlib_scans"`
	// NvlibVanished counts scans that failed on an entry the flip removed
	// between go-nvlib's readdir and its reads: the same as a hot-unplug.
	NvlibVanished int      `json:"nvlib_vanished"`
	NvlibFailures int      `json:"nvlib_failures"`
	NvlibSamples  []string `json:"nvlib_samples"`
}

type verifyReply struct {
	Scans     int             `json:"scans"`
	Scan      linkscan.Result `json:"scan"`
	NvlibGPUs []string        `json:"nvlib_gpus"`
	NvlibErr  string          `json:"nvlib_err"`
}

type scannerReply struct {
	Ready  bool          `json:"ready,omitempty"`
	Verify *verifyReply  `json:"verify,omitempty"`
	Stats  *scannerStats `json:"stats,omitempty"`
}

func scannerMain(stdin io.Reader, stdout io.Writer) int {
	enc := json.NewEncoder(stdout)
	if err := enc.Encode(scannerReply{Ready: true}); err != nil {
		return 1
	}
	cmds := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			cmds <- sc.Text()
		}
		close(cmds)
	}()
	fsys := os.DirFS(sysfs.KernelLinksDir)
	nv := nvpci.New(nvpci.WithLogger(quietLogger{}))
	var st scannerStats
	for {
		select {
		case cmd, ok := <-cmds:
			if !ok || cmd == "stop" {
				if err := enc.Encode(scannerReply{Stats: &st}); err != nil {
					return 1
				}
				return 0
			}
			v := &verifyReply{Scan: linkscan.Links(fsys)}
			if cmd == "verify nvlib" {
				v.NvlibGPUs, v.NvlibErr = nvlibGPUs(nv)
			}
			v.Scans = st.Scans
			if err := enc.Encode(scannerReply{Verify: v}); err != nil {
				return 1
			}
		default:
			time.Sleep(scanPause)
			st.Add(linkscan.Links(fsys))
			if st.Scans%nvlibEvery == 0 {
				st.addNvlib(nv)
			}
		}
	}
}

func nvlibGPUs(nv nvpci.Interface) ([]string, string) {
	devs, err := nv.GetGPUs()
	if err != nil {
		return nil, err.Error()
	}
	gpus := []string{}
	for _, d := range devs {
		gpus = append(gpus, d.Address)
	}
	return gpus, ""
}

// addNvlib runs go-nvlib's scan and sorts a failure: an entry that is gone
// afterwards was removed by the flip; anything else is a real failure.
func (st *scannerStats) addNvlib(nv nvpci.Interface) {
	st.NvlibScans++
	_, err := nv.GetAllDevices()
	if err == nil {
		return
	}
	const prefix = "error constructing NVIDIA PCI device "
	msg := err.Error()
	if rest, ok := strings.CutPrefix(msg, prefix); ok && len(rest) >= 12 {
		if _, lerr := os.Lstat(sysfs.KernelLinksDir + "/" + rest[:12]); errors.Is(lerr, fs.ErrNotExist) {
			st.NvlibVanished++
			return
		}
	}
	st.NvlibFailures++
	if len(st.NvlibSamples) < maxSamples {
		st.NvlibSamples = append(st.NvlibSamples, msg)
	}
}

type quietLogger struct{}

func (quietLogger) Warningf(string, ...any) {}
