package containerdtest

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
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
		if slices.Contains(own, pid) || !Alive(pid) {
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

// Alive reports whether pid is alive and not a zombie.
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}

// CgroupRoot is where the cgroup hierarchies are mounted.
const CgroupRoot = "/sys/fs/cgroup"

// CgroupDirs is cgroup's directory in every hierarchy mounted under root
// (the one v2 tree at root itself, or each v1 controller's directory),
// whether it exists or not: a cgroup has a directory of its own in each
// hierarchy, and all of them must go. Controllers mounted together are
// one directory (cpu,cpuacct) and their names symlinks to it, which are
// skipped so no directory is listed twice. kubetest passes a
// stand-in root in its tests.
func CgroupDirs(root, cgroup string) []string {
	dirs := []string{filepath.Join(root, cgroup)}
	hierarchies, _ := os.ReadDir(root)
	for _, h := range hierarchies {
		if h.IsDir() {
			dirs = append(dirs, filepath.Join(root, h.Name(), cgroup))
		}
	}
	return dirs
}

// RemoveCgroup removes a cgroup and the cgroups below it in every
// hierarchy (CgroupDirs), deepest first: rmdir is how a cgroup is
// removed, and it fails while one still has processes.
func RemoveCgroup(cgroup string) error {
	dirs := CgroupDirs(CgroupRoot, cgroup)
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

// Enter returns a command that runs name with args in the mount, network
// and pid namespaces of the process target (nsenter). nsenter forks the
// program into the pid namespace and waits for it, forwarding no signal:
// signal the program itself, by EnteredPID.
func Enter(target int, name string, args ...string) *exec.Cmd {
	return exec.Command("nsenter", append([]string{"--target", strconv.Itoa(target), "--mount", "--net", "--pid", "--", name}, args...)...)
}

// childTimeout bounds the wait for nsenter's (or unshare's) fork.
const childTimeout = 10 * time.Second

// ChildPID returns the PID (as this process sees it) of a started
// command's one child: the program an Enter command (nsenter) or
// `unshare --fork` runs.
func ChildPID(cmd *exec.Cmd) (int, error) {
	return ChildOf(cmd.Process.Pid)
}

// ChildOf returns the PID of a process's one child, waiting for its fork:
// the program a process that ChildPID found forks in turn (unshare
// --fork, run by nsenter).
func ChildOf(pid int) (int, error) {
	name, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	file := fmt.Sprintf("/proc/%d/task/%d/children", pid, pid)
	for deadline := time.Now().Add(childTimeout); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		b, err := os.ReadFile(file)
		if err != nil {
			return 0, fmt.Errorf("%s (pid %d) exited before its program started: %w", filepath.Base(name), pid, err)
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			return strconv.Atoi(f[0])
		}
	}
	return 0, fmt.Errorf("%s (pid %d) forked no program within %s", filepath.Base(name), pid, childTimeout)
}
