// Command reader is a served container that never stops reading: it scans
// /sys/bus/pci/devices with linkscan in a loop, the kernel resolving every
// link through the CDI mounts, while the DaemonSet's pod re-renders. On
// SIGTERM it prints its totals as one JSON line and exits 0. Built static,
// it is its image's only file.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/overlaytest/linkscan"
)

// totals are what the reader saw over all its scans.
type totals struct {
	linkscan.Totals
	// Views are the entry counts of each distinct whole tree it saw, in
	// order: a reader that lived through a re-render sees two or more.
	Views []int `json:"views"`
}

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fsys := os.DirFS("/sys/bus/pci/devices")
	var st totals
	var view string
	fmt.Println("reading")
	for {
		select {
		case <-stop:
			if err := json.NewEncoder(os.Stdout).Encode(st); err != nil {
				os.Exit(1)
			}
			return
		default:
		}
		r := linkscan.Links(fsys)
		st.Add(r)
		// A whole scan (no entry vanished mid-scan) is one tree's view.
		if r.Vanished == 0 && len(r.Torn) == 0 {
			names := make([]string, 0, len(r.Entries))
			for name := range r.Entries {
				names = append(names, name)
			}
			slices.Sort(names)
			if v := strings.Join(names, " "); v != view {
				view = v
				st.Views = append(st.Views, len(names))
			}
		}
	}
}
