package runtime

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// ownProcesses lists the processes a harness started that are still
// alive (zombies are not): those in containerd's private mount namespace (containerd, the
// shims, runc), which nothing else can be in, and all their descendants
// (the containers, which have namespaces of their own).
func ownProcesses(mountNS string) []int {
	if mountNS == "" {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	children := map[int][]int{}
	var queue []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, ok := parentOf(pid); ok {
			children[ppid] = append(children[ppid], pid)
		}
		if ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/mnt", pid)); err == nil && ns == mountNS {
			queue = append(queue, pid)
		}
	}
	var own []int
	for len(queue) > 0 {
		pid := queue[0]
		queue = queue[1:]
		if slices.Contains(own, pid) || !processExists(pid) {
			continue // seen, or a zombie: dead, only not yet reaped
		}
		own = append(own, pid)
		queue = append(queue, children[pid]...)
	}
	slices.Sort(own)
	return own
}

// parentOf reads a process's parent from /proc/PID/stat, whose second
// field (the command name, in parentheses) may itself hold spaces and
// parentheses.
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(fields) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(fields[1])
	return ppid, err == nil
}

// processExists reports whether pid is alive and not a zombie.
func processExists(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}

// cgroupRoot is where the cgroup hierarchies are mounted.
const cgroupRoot = "/sys/fs/cgroup"

// removeCgroup removes a cgroup and the cgroups below it in every
// hierarchy (v1 controllers, or the one v2 tree), deepest first: rmdir is
// how a cgroup is removed, and it fails while one still has processes.
func removeCgroup(cgroup string) error {
	dirs := []string{filepath.Join(cgroupRoot, cgroup)}
	if hierarchies, err := os.ReadDir(cgroupRoot); err == nil {
		for _, h := range hierarchies {
			dirs = append(dirs, filepath.Join(cgroupRoot, h.Name(), cgroup))
		}
	}
	for _, dir := range dirs {
		var found []string
		err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				found = append(found, p)
			}
			return nil
		})
		if err != nil {
			return err
		}
		for _, p := range slices.Backward(found) {
			if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove cgroup %s: %w", p, err)
			}
		}
	}
	return nil
}
