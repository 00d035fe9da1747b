// Command reader is a served container that never stops reading: it scans
// /sys/bus/pci/devices with linkscan in a loop, the kernel resolving every
// link through the CDI mounts, while the DaemonSet's pod re-renders. It
// prints its progress, a line per view (see progressLine) after 1, 2, 4, 8
// ... whole scans of it, so that a test waits for scans it has made, not
// for a guessed time, and the log stays short however long it runs. On
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

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
)

// totals are what the reader saw over all its scans.
type totals struct {
	linkscan.Totals
	// Views are the entry counts of each distinct whole tree it saw, in
	// order: a reader that lived through a re-render sees two or more.
	Views []int `json:"views"`
}

// progressLine says the reader has made n whole scans in a row of its
// view number view (from 1), which has entries entries; tests parse it
// (containerdtest's DaemonSet test waits on it), so its form is the
// reader's contract.
func progressLine(view, entries, n int) string {
	return fmt.Sprintf("view %d: %d entries, %d whole scans", view, entries, n)
}

func main() {
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	fsys := os.DirFS("/sys/bus/pci/devices")
	var st totals
	var view string
	whole := 0 // whole scans of view in a row
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
				whole = 0
			}
			// Powers of two: a few lines per view, however long it runs.
			if whole++; whole&(whole-1) == 0 {
				fmt.Println(progressLine(len(st.Views), len(names), whole))
			}
		}
	}
}
