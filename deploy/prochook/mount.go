package prochook

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// mountEntry bind-mounts source/name read-only over rootfs/proc/name and
// reports whether it did: false, with no error, when the kernel has no
// such entry.
//
// The target is what a container image could try to aim elsewhere (a
// symlink at /proc, or a /proc that is a bind of some host directory), so
// it is reached one component at a time with O_NOFOLLOW, no link is ever
// followed, and it must lie on the procfs the runtime mounted at
// rootfs/proc: a mount there is seen only in the container's mount
// namespace, never on a host path. Every mount goes through
// /proc/self/fd/N of an O_PATH descriptor, so what was checked is what is
// mounted on, with no path to swap in between.
func mountEntry(source, rootfs, name string) (bool, error) {
	root, err := unix.Open(rootfs, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		// rootfs is the runtime's own path (config.json), not the image's.
		return false, fmt.Errorf("open the container's root: %w", err)
	}
	defer unix.Close(root)
	proc, err := unix.Openat(root, "proc", unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open the container's /proc without following links: %w", err)
	}
	defer unix.Close(proc)
	procStat, err := procfsStat(proc, "the container's /proc")
	if err != nil {
		return false, err
	}
	if err := notShared(proc); err != nil {
		return false, err
	}
	target, err := unix.Openat(proc, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open without following links: %w", err)
	}
	defer unix.Close(target)
	targetStat, err := procfsStat(target, "the target")
	if err != nil {
		return false, err
	}
	if targetStat.Dev != procStat.Dev {
		return false, fmt.Errorf("the target is on device %d, the container's /proc on %d: want the container's own procfs", targetStat.Dev, procStat.Dev)
	}
	if targetStat.Mode&unix.S_IFMT == unix.S_IFLNK {
		return false, errors.New("the target is a symlink: refused")
	}
	src, err := unix.Open(source+"/"+name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, fmt.Errorf("open the rendered %s/%s: %w", source, name, err)
	}
	defer unix.Close(src)
	var srcStat unix.Stat_t
	if err := unix.Fstat(src, &srcStat); err != nil {
		return false, fmt.Errorf("stat the rendered %s/%s: %w", source, name, err)
	}
	if kind(srcStat) != kind(targetStat) {
		return false, fmt.Errorf("the rendered %s/%s is %s, the kernel's entry %s: a bind mount needs both files or both directories", source, name, kind(srcStat), kind(targetStat))
	}
	if err := unix.Mount(fdPath(src), fdPath(target), "", unix.MS_BIND, ""); err != nil {
		return false, fmt.Errorf("bind-mount the rendered %s/%s: %w", source, name, err)
	}
	return true, remountReadOnly(proc, name, srcStat)
}

// remountReadOnly makes the bind just mounted over proc/name read-only,
// nosuid, nodev and noexec. The descriptor that was mounted on still
// names the procfs entry beneath, so the entry is opened again, which
// reaches the top mount, and must be the rendered file.
func remountReadOnly(proc int, name string, src unix.Stat_t) error {
	top, err := unix.Openat(proc, name, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open again after the bind: %w", err)
	}
	defer unix.Close(top)
	var st unix.Stat_t
	if err := unix.Fstat(top, &st); err != nil {
		return fmt.Errorf("stat after the bind: %w", err)
	}
	if st.Dev != src.Dev || st.Ino != src.Ino {
		return fmt.Errorf("after the bind it is device %d inode %d, not the rendered file's %d %d", st.Dev, st.Ino, src.Dev, src.Ino)
	}
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(top, &sfs); err != nil {
		return fmt.Errorf("statfs after the bind: %w", err)
	}
	flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC)
	if err := unix.Mount("", fdPath(top), "", flags|keptAtime(sfs.Flags), ""); err != nil {
		return fmt.Errorf("remount the bind read-only: %w", err)
	}
	return nil
}

// keptAtime is the source mount's atime flags, which a bind remount must
// repeat: in a user namespace the kernel refuses to clear locked ones.
func keptAtime(statfsFlags int64) uintptr {
	var flags uintptr
	for st, ms := range map[int64]uintptr{unix.ST_NOATIME: unix.MS_NOATIME, unix.ST_NODIRATIME: unix.MS_NODIRATIME, unix.ST_RELATIME: unix.MS_RELATIME} {
		if statfsFlags&st != 0 {
			flags |= ms
		}
	}
	return flags
}

// procfsStat checks that fd lies on a procfs and returns its stat.
func procfsStat(fd int, what string) (unix.Stat_t, error) {
	var st unix.Stat_t
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return st, fmt.Errorf("statfs %s: %w", what, err)
	}
	if sfs.Type != unix.PROC_SUPER_MAGIC {
		return st, fmt.Errorf("%s: file system type %#x: want procfs (%#x): the hook mounts only over the container's own /proc", what, sfs.Type, unix.PROC_SUPER_MAGIC)
	}
	if err := unix.Fstat(fd, &st); err != nil {
		return st, fmt.Errorf("stat %s: %w", what, err)
	}
	return st, nil
}

// kind is what a bind mount must match: a directory or not.
func kind(st unix.Stat_t) string {
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return "a directory"
	}
	return "a file"
}

// fdPath names an O_PATH descriptor for mount(2).
func fdPath(fd int) string { return "/proc/self/fd/" + strconv.Itoa(fd) }

// notShared refuses a container /proc whose mount propagates to its peers:
// a pod that mounts the node's /proc with Bidirectional propagation (the
// NVIDIA DRA driver's chart does, with PassthroughSupport) has a /proc
// shared with the node's, and a bind made on it would appear on the
// node's own /proc. The mount is found by its id in this mount namespace's
// mountinfo (the hook runs in the container's).
func notShared(fd int) error {
	var stx unix.Statx_t
	if err := unix.Statx(fd, "", unix.AT_EMPTY_PATH, unix.STATX_MNT_ID, &stx); err != nil {
		return fmt.Errorf("statx the container's /proc: %w", err)
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 {
		return errors.New("the kernel names no mount of the container's /proc (statx without STATX_MNT_ID): its propagation cannot be checked, refused")
	}
	info, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return fmt.Errorf("read this mount namespace's mounts: %w", err)
	}
	switch shared, found := mountShared(info, stx.Mnt_id); {
	case !found:
		return fmt.Errorf("the container's /proc, mount %d, is not in this mount namespace's mountinfo: refused", stx.Mnt_id)
	case shared:
		return fmt.Errorf("the container's /proc is a shared mount (mount %d, a Bidirectional mount of the node's /proc): a bind on it would reach the node's /proc, refused", stx.Mnt_id)
	}
	return nil
}

// mountShared reads mountinfo (proc(5)) for the mount id: found, and
// shared when its optional fields hold a "shared:N" peer group.
func mountShared(mountinfo []byte, id uint64) (shared, found bool) {
	want := []byte(strconv.FormatUint(id, 10))
	for line := range bytes.SplitSeq(mountinfo, []byte("\n")) {
		fields := bytes.Fields(line)
		if len(fields) < 7 || !bytes.Equal(fields[0], want) {
			continue
		}
		for _, f := range fields[6:] {
			if string(f) == "-" {
				break
			}
			if bytes.HasPrefix(f, []byte("shared:")) {
				return true, true
			}
		}
		return false, true
	}
	return false, false
}
