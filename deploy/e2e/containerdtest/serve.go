package containerdtest

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/nriplugin"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

// ServeNRIName is serve --nri as containerd names it: index-name.
const ServeNRIName = nriplugin.DefaultIndex + "-" + nriplugin.DefaultName

// ServeNRI is a running serve --nri: the node's NRI plugin.
type ServeNRI struct {
	Plugin *NRIPlugin
	// Metrics is its /metrics URL.
	Metrics string
}

// ServeNRIOptions say what serve --nri serves.
type ServeNRIOptions struct {
	// Root and Profile are the tree serve renders and serves.
	Root, Profile string
	// Unrendered serves a root serve cannot render (a fleet map that
	// gives the node no profile), as a sabotaged run (programs.Sabotage)
	// does always: serve re-renders whatever root it is given, so an
	// escaped copy or an empty root would be mended, and the rows would
	// not read the sabotage.
	Unrendered bool
	// Flags are more of serve's flags (--nri-inject and the like).
	Flags []string
	// InNode runs serve in containerd's mount namespace, the node's, as
	// the chart's DaemonSet pod runs it: a writable view's FUSE mount is
	// then the node's, where the runtime makes the containers' mounts,
	// and never the host's.
	InNode bool
}

// StartServeNRI runs bin's serve --nri on h with the flags the chart's
// DaemonSet gives it, serving what o says, until containerd has it
// connected and synchronized. Its CDI spec goes to a directory of its
// own, not the runtime's CDI directory, whose specs are other routes'. It
// listens on a free port and logs JSON at debug level, which Logged and
// Metric read.
func (h *Harness) StartServeNRI(t testing.TB, bin string, o ServeNRIOptions) *ServeNRI {
	t.Helper()
	dir := t.TempDir()
	args := []string{"serve", "--nri", "--nri-socket", h.NRISocket, "--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug",
		"--host-devices", "merge", "--also-at", "/host-sys/bus/pci/devices", "--output", filepath.Join(dir, "nvml-mock-sysfs.yaml")}
	if o.Unrendered || programs.Sabotage(t) != "" {
		fleet := filepath.Join(dir, "fleet.yaml")
		if err := os.WriteFile(fleet, []byte("nodes: {}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, "--root", filepath.Join(dir, "unrendered"), "--fleet", fleet, "--node-name", "this-node")
	} else {
		args = append(args, "--root", o.Root, "--profile", o.Profile)
	}
	cmd := exec.Command(bin, append(args, o.Flags...)...)
	if o.InNode {
		cmd = h.NodeCommand(bin, append(args, o.Flags...)...)
	}
	p := h.StartNRIPlugin(t, ServeNRIName, cmd)
	return &ServeNRI{Plugin: p, Metrics: "http://" + serveAddr(t, p) + "/metrics"}
}

// serveAddr is the address serve's log says it listens on.
func serveAddr(t testing.TB, p *NRIPlugin) string {
	t.Helper()
	var addr string
	podtest.Until(t, 10*time.Second, "serve's listening address in its log", func() (bool, string) {
		sc := bufio.NewScanner(strings.NewReader(p.Log()))
		for sc.Scan() {
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "serving" {
				addr = rec.Addr
				return true, ""
			}
		}
		return false, p.Log()
	})
	return addr
}

// Metric is the value of a line of serve's /metrics.
func (n *ServeNRI) Metric(t testing.TB, name string) int {
	t.Helper()
	code, body, err := podtest.Probe(n.Metrics)
	if err != nil || code != 200 {
		t.Fatalf("serve's /metrics: %d %v", code, err)
	}
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("serve's /metrics: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /metrics:\n%s", name, body)
	return 0
}

// Logged reports whether serve logged a record with msg whose pod is pod.
func (n *ServeNRI) Logged(msg, pod string) bool {
	sc := bufio.NewScanner(strings.NewReader(n.Plugin.Log()))
	for sc.Scan() {
		var rec struct{ Msg, Pod string }
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == msg && rec.Pod == pod {
			return true
		}
	}
	return false
}
