package containerdtest

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Pod is what a kubelet puts in a pod sandbox's CRI config that these
// tests vary. Every pod uses the host network: there is no CNI here.
type Pod struct {
	// Name and Namespace are the pod's; Namespace empty means "default".
	Name, Namespace string
	// Labels and Annotations are the pod's (NRI plugins read them).
	Labels, Annotations map[string]string
}

// Container is what a kubelet puts in a container's CRI config that these
// tests vary.
type Container struct {
	Name  string
	Image string
	// Command and Args replace the image's entrypoint and command.
	Command, Args []string
	// Env is KEY=VALUE.
	Env []string
	// Mounts are bind mounts of host paths, as kubelet makes of volumes.
	Mounts []Mount
	// CDIDevices are fully qualified CDI device names, as a device plugin
	// or a DRA driver hands them to the kubelet.
	CDIDevices []string
	// Annotations are the container's (cdi.k8s.io/ ones name CDI devices).
	Annotations map[string]string
	// Security is what a kubelet makes of the container's securityContext.
	Security Security
}

// Security is a container's Linux security context. The zero value is
// the runtime's default: root, the default capabilities, a writable root.
type Security struct {
	ReadOnlyRootfs bool
	// DropCapabilities are capability names, or "ALL".
	DropCapabilities []string
	// NoNewPrivs is allowPrivilegeEscalation: false.
	NoNewPrivs bool
	// RunAsUser, when set, is the user the process runs as.
	RunAsUser *int64
}

// Mount is a CRI bind mount.
type Mount struct {
	HostPath, ContainerPath string
	ReadOnly                bool
	// Bidirectional is a volume's mountPropagation: Bidirectional (CRI's
	// PROPAGATION_BIDIRECTIONAL): containerd binds it rshared, and wants
	// its source a shared mount in its own mount namespace.
	Bidirectional bool
}

// The CRI messages, in the JSON crictl reads (the protobuf field names of
// k8s.io/cri-api's runtime/v1). Only the fields used here.
type (
	criMetadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace,omitempty"`
		UID       string `json:"uid,omitempty"`
		Attempt   uint32 `json:"attempt"`
	}
	criNamespaceOptions struct {
		// Network is a NamespaceMode: 2 is NODE, the host's.
		Network int `json:"network"`
	}
	criSecurityContext struct {
		NamespaceOptions criNamespaceOptions `json:"namespace_options"`
	}
	criLinux struct {
		CgroupParent    string             `json:"cgroup_parent"`
		SecurityContext criSecurityContext `json:"security_context"`
	}
	criPodConfig struct {
		Metadata     criMetadata       `json:"metadata"`
		LogDirectory string            `json:"log_directory"`
		Labels       map[string]string `json:"labels,omitempty"`
		Annotations  map[string]string `json:"annotations,omitempty"`
		Linux        criLinux          `json:"linux"`
	}
	criKeyValue struct {
		Key   string `json:"key"`
		Value string `json:"value"`
	}
	criMount struct {
		ContainerPath string `json:"container_path"`
		HostPath      string `json:"host_path"`
		Readonly      bool   `json:"readonly,omitempty"`
		// Propagation is a MountPropagation: 2 is BIDIRECTIONAL.
		Propagation int `json:"propagation,omitempty"`
	}
	criCDIDevice struct {
		Name string `json:"name"`
	}
	criImageSpec struct {
		Image string `json:"image"`
	}
	criCapability struct {
		DropCapabilities []string `json:"drop_capabilities,omitempty"`
	}
	criInt64Value struct {
		Value int64 `json:"value"`
	}
	criContainerSecurityContext struct {
		Capabilities   *criCapability `json:"capabilities,omitempty"`
		RunAsUser      *criInt64Value `json:"run_as_user,omitempty"`
		ReadonlyRootfs bool           `json:"readonly_rootfs,omitempty"`
		NoNewPrivs     bool           `json:"no_new_privs,omitempty"`
	}
	criContainerLinux struct {
		SecurityContext criContainerSecurityContext `json:"security_context"`
	}
	criContainerConfig struct {
		Metadata    criMetadata       `json:"metadata"`
		Image       criImageSpec      `json:"image"`
		Command     []string          `json:"command,omitempty"`
		Args        []string          `json:"args,omitempty"`
		Envs        []criKeyValue     `json:"envs,omitempty"`
		Mounts      []criMount        `json:"mounts,omitempty"`
		Annotations map[string]string `json:"annotations,omitempty"`
		LogPath     string            `json:"log_path"`
		CDIDevices  []criCDIDevice    `json:"CDI_devices,omitempty"`
		Linux       criContainerLinux `json:"linux"`
	}
)

// namespaceModeNode is CRI's NamespaceMode NODE: the host's namespace.
const namespaceModeNode = 2

// propagationBidirectional is CRI's MountPropagation BIDIRECTIONAL.
const propagationBidirectional = 2

// Sandbox is a running pod sandbox.
type Sandbox struct {
	ID     string
	h      *Harness
	config string // the pod config file, which crictl create wants again
	dir    string
}

// CRIContainer is a created and started container of a Sandbox.
type CRIContainer struct {
	ID   string
	Name string
	s    *Sandbox
}

// crictlConfig is crictl's configuration for this containerd, written
// at Start, so the host's /etc/crictl.yaml plays no part.
func (h *Harness) crictlConfig() string {
	return "runtime-endpoint: unix://" + h.Address + "\nimage-endpoint: unix://" + h.Address + "\ntimeout: 60\n"
}

// crictlCommand is crictl speaking to this containerd.
func (h *Harness) crictlCommand(args ...string) *exec.Cmd {
	return exec.Command(h.crictl, append([]string{"--config", filepath.Join(h.Dir, "crictl.yaml")}, args...)...)
}

// crictlRun runs crictl and returns its standard output, and its standard
// error with any failure (crictl warns there even when it succeeds).
func (h *Harness) crictlRun(args ...string) (string, error) {
	cmd := h.crictlCommand(args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("crictl %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Crictl runs crictl and fails the test if it fails, returning its
// standard output.
func (h *Harness) Crictl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := h.crictlRun(args...)
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	return strings.TrimSpace(out)
}

func writeJSON(t testing.TB, file string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// RunPod runs a pod sandbox (from PauseImage, in the host network) and
// stops and removes it when the test ends.
func (h *Harness) RunPod(t testing.TB, p Pod) *Sandbox {
	t.Helper()
	began := time.Now()
	p.Namespace = cmp.Or(p.Namespace, "default")
	dir := t.TempDir()
	s := &Sandbox{h: h, dir: dir, config: filepath.Join(dir, "pod.json")}
	writeJSON(t, s.config, criPodConfig{
		Metadata:     criMetadata{Name: p.Name, Namespace: p.Namespace, UID: fmt.Sprintf("uid-%s-%d", p.Name, time.Now().UnixNano())},
		LogDirectory: filepath.Join(dir, "logs"),
		Labels:       p.Labels,
		Annotations:  p.Annotations,
		Linux: criLinux{
			CgroupParent:    h.CgroupParent,
			SecurityContext: criSecurityContext{NamespaceOptions: criNamespaceOptions{Network: namespaceModeNode}},
		},
	})
	s.ID = h.Crictl(t, "runp", s.config)
	t.Cleanup(func() {
		if _, err := h.crictlRun("stopp", s.ID); err != nil {
			t.Errorf("runtime: pod %s: %v", p.Name, err)
		}
		if _, err := h.crictlRun("rmp", s.ID); err != nil {
			t.Errorf("runtime: pod %s: %v", p.Name, err)
		}
	})
	h.logf("pod %s/%s: sandbox %.12s running in %s", p.Namespace, p.Name, s.ID, time.Since(began).Round(time.Millisecond))
	return s
}

// Start creates and starts a container in the sandbox.
func (s *Sandbox) Start(t testing.TB, c Container) *CRIContainer {
	t.Helper()
	id, err := s.Create(t, c)
	if err != nil {
		t.Fatalf("runtime: %v", err)
	}
	s.h.Crictl(t, "start", id)
	return &CRIContainer{ID: id, Name: c.Name, s: s}
}

// Create creates a container in the sandbox and returns its ID, or the
// error the runtime refused it with (an NRI plugin's among them), as the
// kubelet sees it.
func (s *Sandbox) Create(t testing.TB, c Container) (string, error) {
	t.Helper()
	cfg := criContainerConfig{
		Metadata:    criMetadata{Name: c.Name},
		Image:       criImageSpec{Image: c.Image},
		Command:     c.Command,
		Args:        c.Args,
		Annotations: c.Annotations,
		LogPath:     c.Name + ".log",
		Linux: criContainerLinux{SecurityContext: criContainerSecurityContext{
			ReadonlyRootfs: c.Security.ReadOnlyRootfs,
			NoNewPrivs:     c.Security.NoNewPrivs,
		}},
	}
	if len(c.Security.DropCapabilities) > 0 {
		cfg.Linux.SecurityContext.Capabilities = &criCapability{DropCapabilities: c.Security.DropCapabilities}
	}
	if c.Security.RunAsUser != nil {
		cfg.Linux.SecurityContext.RunAsUser = &criInt64Value{Value: *c.Security.RunAsUser}
	}
	for _, kv := range c.Env {
		k, v, _ := strings.Cut(kv, "=")
		cfg.Envs = append(cfg.Envs, criKeyValue{Key: k, Value: v})
	}
	for _, m := range c.Mounts {
		cm := criMount{ContainerPath: m.ContainerPath, HostPath: m.HostPath, Readonly: m.ReadOnly}
		if m.Bidirectional {
			cm.Propagation = propagationBidirectional
		}
		cfg.Mounts = append(cfg.Mounts, cm)
	}
	for _, d := range c.CDIDevices {
		cfg.CDIDevices = append(cfg.CDIDevices, criCDIDevice{Name: d})
	}
	file := filepath.Join(s.dir, c.Name+".json")
	writeJSON(t, file, cfg)
	id, err := s.h.crictlRun("create", s.ID, file, s.config)
	return strings.TrimSpace(id), err
}

// criContainerStatus is the part of `crictl inspect` read here.
type criContainerStatus struct {
	Status struct {
		State    string `json:"state"`
		ExitCode int    `json:"exitCode"`
		Reason   string `json:"reason"`
	} `json:"status"`
}

// Wait waits until the container has exited and returns its exit code.
func (c *CRIContainer) Wait(t testing.TB, timeout time.Duration) int {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		var st criContainerStatus
		out := c.s.h.Crictl(t, "inspect", "--output", "json", c.ID)
		if err := json.Unmarshal([]byte(out), &st); err != nil {
			t.Fatalf("runtime: crictl inspect %s: %v\n%s", c.Name, err, out)
		}
		if st.Status.State == "CONTAINER_EXITED" {
			return st.Status.ExitCode
		}
		if time.Now().After(deadline) {
			t.Fatalf("runtime: container %s still %s after %s", c.Name, st.Status.State, timeout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Logs returns what the container wrote to its standard output and
// standard error.
func (c *CRIContainer) Logs(t testing.TB) (stdout, stderr string) {
	t.Helper()
	cmd := c.s.h.crictlCommand("logs", c.ID)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		t.Fatalf("runtime: crictl logs %s: %v\n%s", c.Name, err, e.String())
	}
	return o.String(), e.String()
}

// Stop stops the container as a kubelet does: SIGTERM, then SIGKILL after
// the grace period.
func (c *CRIContainer) Stop(t testing.TB, grace time.Duration) {
	t.Helper()
	c.s.h.Crictl(t, "stop", "--timeout", fmt.Sprint(int(grace.Seconds())), c.ID)
}

// Remove removes the container (stopping it first if it still runs).
func (c *CRIContainer) Remove(t testing.TB) {
	t.Helper()
	c.s.h.Crictl(t, "rm", "--force", c.ID)
}

// Result is how a container that ran to completion ended.
type Result struct {
	ExitCode       int
	Stdout, Stderr string
}

// Run runs a container to completion in the sandbox, removes it, and
// returns its exit code and output.
func (s *Sandbox) Run(t testing.TB, c Container) Result {
	t.Helper()
	began := time.Now()
	ctr := s.Start(t, c)
	code := ctr.Wait(t, 2*time.Minute)
	stdout, stderr := ctr.Logs(t)
	ctr.Remove(t)
	s.h.logf("container %s: exit %d in %s", c.Name, code, time.Since(began).Round(time.Millisecond))
	return Result{ExitCode: code, Stdout: stdout, Stderr: stderr}
}
