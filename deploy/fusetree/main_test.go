package fusetree

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

const (
	// envPrivate marks the test binary re-run in a mount namespace of its
	// own.
	envPrivate = "FUSETREE_TEST_PRIVATE_NS"
	// envServe makes the test binary a server of "backing\nmountpoint"
	// (serveChild), for the tests that need a server in another process.
	envServe = "FUSETREE_TEST_SERVE"
)

// TestMain re-runs the tests in a private mount namespace when it can, so
// nothing a test mounts can outlive the test binary or show on the host,
// even when a test dies half-way. The tests clean up after themselves
// anyway, and TestMain checks that they did.
func TestMain(m *testing.M) {
	if spec := os.Getenv(envServe); spec != "" {
		os.Exit(serveChild(spec))
	}
	if os.Getenv(envPrivate) == "" && overlaytest.FUSEUnusable() == "" {
		if code, ok := runPrivate(); ok {
			os.Exit(code)
		}
	}
	code := m.Run()
	if overlaytest.FUSEUnusable() == "" {
		if left := fusetreeMounts(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "fusetree tests left mounted: %s\n", strings.Join(left, ", "))
			code = 1
		}
	}
	os.Exit(code)
}

// runPrivate runs this test binary again in a new mount namespace (Go
// makes its mounts private) and returns its exit code; false when the
// namespace cannot be had, and the tests run here.
func runPrivate() (int, bool) {
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), envPrivate+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "fusetree tests: no private mount namespace (%v); running in this one\n", err)
		return 0, false
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT)
	go func() {
		for s := range sigs {
			cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if exit.ExitCode() < 0 {
			return 1, true
		}
		return exit.ExitCode(), true
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "fusetree tests: %v\n", err)
		return 1, true
	}
	return 0, true
}

// fusetreeMounts lists the mount points of fusetree's type in this mount
// namespace.
func fusetreeMounts() []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return []string{err.Error()}
	}
	var left []string
	for _, line := range strings.Split(string(data), "\n") {
		if strings.Contains(line, " - fuse.fusetree ") {
			left = append(left, strings.Fields(line)[4])
		}
	}
	return left
}

// serveChild serves spec's backing tree at its mount point until stdin
// closes, telling the parent "ready" on stdout once mounted. The parent
// kills it to leave a dead mount behind.
func serveChild(spec string) int {
	backing, mountPoint, _ := strings.Cut(spec, "\n")
	srv, err := Mount(Options{Backing: backing, MountPoint: mountPoint})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println("ready")
	io.Copy(io.Discard, os.Stdin)
	if err := srv.Unmount(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startServer runs serveChild in a child process and returns once it
// serves. The child is killed at the end of the test if still running.
func startServer(t *testing.T, backing, mountPoint string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envServe+"="+backing+"\n"+mountPoint)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(s)
	}()
	select {
	case s := <-line:
		if s != "ready" {
			t.Fatalf("child server: %s", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("child server: not ready after 10s")
	}
	return cmd
}
