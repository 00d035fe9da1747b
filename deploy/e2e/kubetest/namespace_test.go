package kubetest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// standIn is a host in a temporary directory: the kubelet's sysctls (all
// 0, so that vm.panic_on_oom is the kubelet's already and the others are
// not), a
// cgroup root of two hierarchies whose podCgroup holds another cluster's
// container, the kubelet's directories (none there), a mount table.
func standIn(t *testing.T) hostPaths {
	dir := t.TempDir()
	p := hostPaths{
		sysctlRoot: filepath.Join(dir, "proc-sys"),
		cgroupRoot: filepath.Join(dir, "cgroup"),
		dirs:       []string{filepath.Join(dir, "var-lib-kubelet"), filepath.Join(dir, "var-log-pods")},
		mountinfo:  filepath.Join(dir, "mountinfo"),
	}
	for _, s := range kubeletSysctls() {
		require.NoError(t, os.MkdirAll(filepath.Dir(p.sysctl(s.name)), 0o755))
		require.NoError(t, os.WriteFile(p.sysctl(s.name), []byte("0\n"), 0o644))
	}
	for _, h := range []string{"memory", "pids"} {
		require.NoError(t, os.MkdirAll(filepath.Join(p.cgroupRoot, h, podCgroup, "another-clusters"), 0o755))
	}
	require.NoError(t, os.WriteFile(p.mountinfo, []byte("22 1 0:21 / /proc rw - proc proc rw\n"), 0o644))
	return p
}

// id is a container ID, as containerd makes them.
func id(n int) string { return fmt.Sprintf("%064x", n) }

// startedCluster is a cluster on the stand-in host as Start leaves it,
// its containerd having made the containers ours.
func startedCluster(t *testing.T, p hostPaths, ours ...string) *Cluster {
	c := &Cluster{Dir: t.TempDir(), paths: p, containers: map[string]bool{}}
	c.host = p.read()
	for _, o := range ours {
		c.containers[o] = true
	}
	return c
}

// TestLeftovers is Leftovers' negative control: each kind of leftover,
// planted on a stand-in host (and a live process of the test's), is
// reported; a host as it was reports nothing.
func TestLeftovers(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, c *Cluster)
		want  string
	}{
		{"clean", func(*testing.T, *Cluster) {}, ""},
		{"a sysctl the kubelet changed", func(t *testing.T, c *Cluster) {
			require.NoError(t, os.WriteFile(c.paths.sysctl("vm/overcommit_memory"), []byte("1\n"), 0o644))
		}, "sysctl vm.overcommit_memory: 1, the kubelet's value, was 0"},
		{"a kubelet directory", func(t *testing.T, c *Cluster) {
			require.NoError(t, os.Mkdir(c.paths.dirs[1], 0o755))
		}, "directory " + "DIR1"},
		{"the cgroup of a pod deleted while the cluster ran", func(t *testing.T, c *Cluster) {
			require.NoError(t, os.Mkdir(filepath.Join(c.paths.cgroupRoot, "pids", podCgroup, id(1)), 0o755))
		}, "cgroup CGROUP/pids/k8s.io/" + id(1)},
		{"podCgroup the cluster made, empty", func(t *testing.T, c *Cluster) {
			require.NoError(t, os.MkdirAll(filepath.Join(c.paths.cgroupRoot, "cpu", podCgroup), 0o755))
		}, "cgroup CGROUP/cpu/k8s.io"},
		{"a mount below Dir", func(t *testing.T, c *Cluster) {
			line := "40 22 0:50 / " + c.Dir + "/kubelet/pods/x rw - tmpfs tmpfs rw\n"
			f, err := os.OpenFile(c.paths.mountinfo, os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.WriteString(line)
			require.NoError(t, err)
			require.NoError(t, f.Close())
		}, "mount DIR/kubelet/pods/x"},
		{"a process the cluster started", func(t *testing.T, c *Cluster) {
			p := &Process{Name: "kubelet", cmd: exec.Command("sleep", "60"), exited: make(chan struct{})}
			require.NoError(t, p.cmd.Start())
			t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
			c.procs = append(c.procs, p)
		}, "process PID (nsenter of kubelet)"},
		{"a process in the namespace", func(t *testing.T, c *Cluster) {
			if os.Geteuid() != 0 {
				overlaytest.Missing(t, "needs root: a pid namespace")
			}
			cmd := exec.Command("sleep", "60")
			cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
			require.NoError(t, cmd.Start())
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", cmd.Process.Pid))
			require.NoError(t, err)
			c.host.pidNS = ns
		}, "process PID sleep 60"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := standIn(t)
			c := startedCluster(t, p, id(1))
			tc.plant(t, c)
			left := c.Leftovers()
			if tc.want == "" {
				require.Empty(t, left)
				return
			}
			pid := ""
			if len(c.procs) > 0 {
				pid = fmt.Sprint(c.procs[0].cmd.Process.Pid)
			}
			want := strings.NewReplacer("DIR1", p.dirs[1], "CGROUP", p.cgroupRoot, "DIR", c.Dir, "PID", pid).Replace(tc.want)
			if strings.HasPrefix(tc.name, "a process in") {
				require.Len(t, left, 1)
				require.Regexp(t, `^process [0-9]+ sleep 60$`, left[0])
				return
			}
			require.Equal(t, []string{want}, left)
		})
	}
}

// TestLeftoverSysctls: on a stand-in host whose sysctls are all 0, after
// a kubelet ran, each sysctl the host does not hold as it was is reported,
// the kubelet's value above all; and where the host's value differs from
// the kubelet's, so is a namespace's copy that did not catch the kubelet's
// write. vm.panic_on_oom, 0 for the kubelet too, is the case no check can
// tell: the kubelet writes nothing there.
func TestLeftoverSysctls(t *testing.T) {
	// kubeletRan is a cluster whose kubelet ran and wrote its value into
	// every copy, but for those in skip (a write not caught).
	kubeletRan := func(t *testing.T, skip ...string) *Cluster {
		c := startedCluster(t, standIn(t))
		c.Kubelet = &Process{Name: "kubelet"}
		require.NoError(t, os.MkdirAll(filepath.Join(c.Dir, "sysctl"), 0o755))
		for _, s := range kubeletSysctls() {
			v := s.value
			if slices.Contains(skip, s.name) {
				v = c.host.sysctls[s.name]
			}
			require.NoError(t, os.WriteFile(c.sysctlCopy(s.name), []byte(v+"\n"), 0o644))
		}
		return c
	}
	set := func(t *testing.T, c *Cluster, name, value string) {
		require.NoError(t, os.WriteFile(c.paths.sysctl(name), []byte(value+"\n"), 0o644))
	}

	t.Run("contained", func(t *testing.T) {
		require.Empty(t, kubeletRan(t).Leftovers())
	})
	t.Run("the kubelet's value on the host", func(t *testing.T) {
		c := kubeletRan(t)
		set(t, c, "kernel/panic", "10")
		require.Equal(t, []string{"sysctl kernel.panic: 10, the kubelet's value, was 0"}, c.Leftovers())
	})
	t.Run("another value on the host", func(t *testing.T) {
		c := kubeletRan(t)
		set(t, c, "kernel/keys/root_maxkeys", "200")
		require.Equal(t, []string{"sysctl kernel.keys.root_maxkeys: 200, was 0"}, c.Leftovers())
	})
	t.Run("a write the copy did not catch", func(t *testing.T) {
		// The host as it was, and a copy as it was: the host's value
		// alone would pass.
		c := kubeletRan(t, "vm/overcommit_memory")
		require.Equal(t, []string{"sysctl vm.overcommit_memory: the namespace's copy holds 0, not the kubelet's 1: its write was not caught there, so the host's 0 proves nothing"}, c.Leftovers())
	})
	t.Run("a sysctl the host agrees on", func(t *testing.T) {
		// vm.panic_on_oom is 0 on the host and for the kubelet: its copy
		// proves nothing and is not asked; a host that changed is still
		// reported.
		c := kubeletRan(t, "vm/panic_on_oom")
		require.Empty(t, c.Leftovers())
		set(t, c, "vm/panic_on_oom", "1")
		require.Equal(t, []string{"sysctl vm.panic_on_oom: 1, was 0"}, c.Leftovers())
	})
	t.Run("no kubelet ran", func(t *testing.T) {
		// A start that failed before the kubelet: no copy to vouch, and
		// none asked for.
		require.Empty(t, startedCluster(t, standIn(t)).Leftovers())
	})
}

// TestRemoveCgroups: Stop removes every new cgroup of the cluster's
// containers, including those of pods gone before the end, and the
// podCgroup it made; it leaves the cgroups that were there and another
// cluster's, and one it cannot remove (a process in it, here a child)
// is reported.
func TestRemoveCgroups(t *testing.T) {
	p := standIn(t)
	c := startedCluster(t, p, id(1), id(2), id(3))
	dir := func(h, name string) string { return filepath.Join(p.cgroupRoot, h, podCgroup, name) }
	for _, d := range []string{dir("memory", id(1)), dir("pids", id(1)), dir("memory", id(2)), dir("pids", id(3)) + "/busy", dir("memory", id(9))} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	require.NoError(t, os.MkdirAll(filepath.Join(p.cgroupRoot, "cpu", podCgroup, id(2)), 0o755))

	removed, err := c.removeCgroups()
	require.Error(t, err, "the busy cgroup")
	require.Contains(t, err.Error(), dir("pids", id(3)))
	require.Equal(t, 4, removed, "id 1 in two hierarchies, id 2 in two")
	for _, gone := range []string{dir("memory", id(1)), dir("pids", id(1)), dir("memory", id(2)), filepath.Join(p.cgroupRoot, "cpu", podCgroup)} {
		require.NoDirExists(t, gone)
	}
	for _, kept := range []string{dir("memory", "another-clusters"), dir("pids", "another-clusters"), dir("memory", id(9))} {
		require.DirExists(t, kept)
	}
	require.Equal(t, []string{"cgroup " + dir("pids", id(3))}, c.Leftovers(), "another cluster's new cgroup is not ours")
}

// TestContainerIDs reads the IDs containerd's log names.
func TestContainerIDs(t *testing.T) {
	log := `level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:fit,} returns sandbox id \"` + id(7) + `\""` + "\n" +
		`level=info msg="CreateContainer within sandbox \"` + id(7) + `\" for container &ContainerMetadata{Name:verify,} returns container id \"` + id(8) + `\""`
	require.Equal(t, []string{id(7), id(7), id(8)}, containerIDs(log))
	require.Empty(t, containerIDs("sha256:"+id(5)[:63]))
}
