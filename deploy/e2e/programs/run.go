package programs

// The runners: for each consumer, the command line and environment of one
// run, and a parser of what it prints. They take paths as the program will
// see them, so the same Invocation runs in a served mount namespace
// (hosttest.Served) or, with the paths mounted into it, in a CRI
// container.

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/pciaddr"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Invocation is one run of a consumer: its command line (Args[0] is the
// program) and the environment it needs beyond the caller's.
type Invocation struct {
	Args []string
	Env  []string
}

// In returns a command that runs the invocation inside s's private mount
// namespace.
func (inv Invocation) In(s hosttest.Served) *exec.Cmd {
	s.Env = append(slices.Clip(s.Env), inv.Env...)
	return s.Command(inv.Args[0], inv.Args[1:]...)
}

// GFDRun is one run of GPU Feature Discovery with nvml-mock's NVML.
type GFDRun struct {
	Binary string // gpu-feature-discovery (GFD's output)
	// NVMLDir holds the libnvidia-ml.so.1 GFD loads (NVML.Dir).
	NVMLDir string
	// Profile is the nvml-mock profile file that NVML serves: the file the
	// tree was rendered from.
	Profile string
	// OutputFile is where GFD writes its labels, one key=value a line.
	// Its machine type file is the default (the node's own) unless the
	// run's environment names one, as a served spec does
	// (cdispec.MachineTypeFileEnv).
	OutputFile string
	// Strategy is GFD's --device-discovery-strategy; empty keeps its
	// default (auto: NVML). "vfio" labels the GPUs go-nvlib finds bound to
	// vfio-pci, from PCI sysfs alone.
	Strategy string
	// NodeFeatureAPI publishes the labels as a NodeFeature object through
	// the API server (in a pod: its ServiceAccount, NODE_NAME and
	// NAMESPACE), for nfd-master to put on the Node, instead of writing
	// OutputFile.
	NodeFeatureAPI bool
}

// Invocation runs GFD once, writing its labels to OutputFile and nothing
// to the API server, or only to the API server (NodeFeatureAPI).
func (r GFDRun) Invocation() Invocation {
	args := []string{r.Binary, "--oneshot", "--no-timestamp", "--use-node-feature-api=false", "--output-file", r.OutputFile}
	if r.NodeFeatureAPI {
		args = []string{r.Binary, "--oneshot", "--no-timestamp", "--use-node-feature-api=true"}
	}
	if r.Strategy != "" {
		args = append(args, "--device-discovery-strategy", r.Strategy)
	}
	return Invocation{Args: args, Env: NVMLEnv(r.NVMLDir, r.Profile)}
}

// GFDMachineLabel is the nvidia.com/gpu.machine value GFD makes of a
// machine type: it drops every character outside [A-Za-z0-9-_. ] and joins
// the words with "-" (sanitise, internal/lm/resource.go). It is the
// expectation, stated from GFD's source; the label itself always comes
// from GFD.
func GFDMachineLabel(machine string) string {
	kept := regexp.MustCompile(`[^A-Za-z0-9-_. ]`).ReplaceAllString(machine, "")
	return strings.Join(strings.Fields(kept), "-")
}

// ParseGFDLabels reads GFD's output file: one label=value a line.
func ParseGFDLabels(data []byte) (map[string]string, error) {
	labels := map[string]string{}
	for i, line := range strings.Split(string(data), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("GFD output line %d: %q is not label=value", i+1, line)
		}
		labels[k] = v
	}
	return labels, nil
}

// WriteDeviceNodes makes the device nodes NodePrepareResources puts in a
// claim's CDI spec, under the driver root's dev/: nvidiactl, nvidia-uvm,
// nvidia-uvm-tools and nvidia0 to nvidia<gpus-1>, character devices with
// /dev/null's numbers, which is what any container may open.
func WriteDeviceNodes(driverRoot string, gpus int) error {
	dev := filepath.Join(driverRoot, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return fmt.Errorf("driver root: %w", err)
	}
	names := []string{"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"}
	for i := range gpus {
		names = append(names, fmt.Sprintf("nvidia%d", i))
	}
	for _, n := range names {
		if err := unix.Mknod(filepath.Join(dev, n), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
			return fmt.Errorf("driver root: mknod %s: %w", n, err)
		}
	}
	return nil
}

// WriteDriverRoot makes dir the driver root the DRA driver expects: the
// mock NVML library copied to usr/lib64/libnvidia-ml.so.1 (a copy, so the
// root also works where the cache is not mounted) and an executable
// usr/bin/nvidia-smi that exits 0, which the driver only locates.
func WriteDriverRoot(dir, mockNVML string) error {
	lib, err := os.ReadFile(filepath.Join(mockNVML, MockNVML))
	if err != nil {
		return fmt.Errorf("driver root: %w", err)
	}
	for _, f := range []struct {
		path string
		data []byte
		mode os.FileMode
	}{
		{"usr/lib64/" + MockNVML, lib, 0o755},
		{"usr/bin/nvidia-smi", []byte("#!/bin/sh\nexit 0\n"), 0o755},
	} {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("driver root: %w", err)
		}
		if err := os.WriteFile(p, f.data, f.mode); err != nil {
			return fmt.Errorf("driver root: %w", err)
		}
	}
	return nil
}

// PCIeRootAttribute is the attribute that names a device's PCIe root
// complex, the one a plain escaped link loses.
const PCIeRootAttribute = "resource.kubernetes.io/pcieRoot"

// NFDHostPCIDevices is where nfd-worker, built with the /host- prefix as
// upstream ships it, reads the PCI devices: a served container must get the
// links directory there too.
const NFDHostPCIDevices = "/host-sys/" + sysfs.LinksDir

// NFDWorkerRun is one run of node-feature-discovery's worker with only its
// PCI source, publishing nothing.
type NFDWorkerRun struct {
	Binary string // nfd-worker (NFDWorker's output)
	// Kubeconfig is a file WriteKubeconfig wrote: the worker needs one
	// even with -no-publish, and never dials it.
	Kubeconfig string
	// NodeName is the node the worker labels; empty means
	// "nvml-mock-sysfs-e2e".
	NodeName string
	// DeviceClassWhitelist is the PCI source's deviceClassWhitelist
	// (class or class+subclass prefixes, "0200"); empty keeps the
	// worker's default (03, 0b40, 12).
	DeviceClassWhitelist []string
	// DeviceLabelFields are the PCI source's deviceLabelFields ("class",
	// "vendor", ...), which name each label; empty keeps the worker's
	// default (class and vendor: pci-0302_10de).
	DeviceLabelFields []string
	// Publish sends the labels to the API server as a NodeFeature object,
	// for nfd-master to put on the Node; Kubeconfig empty then means the
	// in-cluster config of a pod's ServiceAccount.
	Publish bool
	// Local adds the local source: the files other programs write to
	// NFDFeaturesDir (GFD without the NodeFeature API writes its labels
	// there), whose labels the worker publishes as its own.
	Local bool
}

// NFDFeaturesDir is where nfd-worker's local source reads feature files,
// and where GFD writes its own without the NodeFeature API.
const NFDFeaturesDir = "/etc/kubernetes/node-feature-discovery/features.d"

// Invocation runs the worker once; its labels go to its log (and, with
// Publish, to the API server).
func (r NFDWorkerRun) Invocation() (Invocation, error) {
	node := r.NodeName
	node = cmp.Or(node, "nvml-mock-sysfs-e2e")
	sources := "pci"
	if r.Local {
		sources = "pci,local"
	}
	args := []string{r.Binary, "-oneshot", "-feature-sources=" + sources, "-label-sources=" + sources, "-port", "0", "-v", "1"}
	if !r.Publish {
		args = append(args, "-no-publish")
	}
	if r.Kubeconfig != "" {
		args = append(args, "-kubeconfig", r.Kubeconfig)
	}
	pci := map[string]any{}
	if len(r.DeviceClassWhitelist) > 0 {
		pci["deviceClassWhitelist"] = r.DeviceClassWhitelist
	}
	if len(r.DeviceLabelFields) > 0 {
		pci["deviceLabelFields"] = r.DeviceLabelFields
	}
	if len(pci) > 0 {
		opts, err := json.Marshal(map[string]any{"sources": map[string]any{"pci": pci}})
		if err != nil {
			return Invocation{}, err
		}
		args = append(args, "-options", string(opts))
	}
	return Invocation{Args: args, Env: []string{"NODE_NAME=" + node}}, nil
}

// WriteKubeconfig writes a kubeconfig whose cluster is 127.0.0.1:1, where
// nothing listens: nfd-worker insists on one but, with -no-publish, never
// connects.
func WriteKubeconfig(path string) error {
	const kubeconfig = `apiVersion: v1
kind: Config
clusters:
- name: none
  cluster:
    server: https://127.0.0.1:1
contexts:
- name: none
  context:
    cluster: none
    user: none
current-context: none
users:
- name: none
  user:
    token: none
`
	return os.WriteFile(path, []byte(kubeconfig), 0o600)
}

// ParseNFDLabels finds the labels in nfd-worker's log: klog writes the
// "feature discovery completed" line's labels value (YAML, label: "value",
// or {} for none) as a multi-line block between "labels=<" and ">".
func ParseNFDLabels(log []byte) (map[string]string, error) {
	lines := strings.Split(string(log), "\n")
	for i, line := range lines {
		if !strings.Contains(line, `"feature discovery completed"`) || strings.Contains(line, "featureSource=") {
			continue
		}
		labels := map[string]string{}
		if strings.HasSuffix(line, "labels=<") {
			for _, l := range lines[i+1:] {
				l = strings.TrimSpace(l)
				switch l {
				case ">":
					return labels, nil
				case "{}", "": // YAML's empty map: no labels
					continue
				}
				k, v, ok := strings.Cut(l, ": ")
				if !ok {
					return nil, fmt.Errorf("nfd-worker log: %q is not label: value", l)
				}
				if uq, err := strconv.Unquote(v); err == nil {
					v = uq
				}
				labels[k] = v
			}
			return nil, fmt.Errorf("nfd-worker log: the labels of %q never end", line)
		}
		// Without a labels block the worker logged below verbosity 1.
		return nil, fmt.Errorf("nfd-worker log: %q has no labels (run it with -v 1)", line)
	}
	return nil, fmt.Errorf("nfd-worker log has no \"feature discovery completed\" line:\n%s", log)
}

// GHWListRun is one run of ghw-list (GHWList's output).
type GHWListRun struct {
	Binary string
}

// Invocation lists the PCI devices ghw finds.
func (r GHWListRun) Invocation() Invocation { return Invocation{Args: []string{r.Binary}} }

// GHWDevice is one device ghw.PCI() lists; ids are ghw's lower-case hex.
type GHWDevice struct {
	Address       string `json:"address"`
	ParentAddress string `json:"parentAddress"`
	Vendor        string `json:"vendor"`
	Product       string `json:"product"`
	Class         string `json:"class"`
	Subclass      string `json:"subclass"`
	ProgIf        string `json:"progIf"`
	Revision      string `json:"revision"`
	Driver        string `json:"driver"`
}

// ParseGHWDevices reads ghw-list's standard output.
func ParseGHWDevices(stdout []byte) ([]GHWDevice, error) {
	var devices []GHWDevice
	if err := json.Unmarshal(stdout, &devices); err != nil {
		return nil, fmt.Errorf("ghw-list output: %w", err)
	}
	return devices, nil
}

// NVMLListRun is one run of nvml-list (NVMLList's output) with the mock
// NVML.
type NVMLListRun struct {
	Binary  string
	NVMLDir string // holds the libnvidia-ml.so.1 it loads (NVML.Dir)
	Profile string // the nvml-mock profile file that NVML serves
}

// Invocation lists the GPUs NVML reports.
func (r NVMLListRun) Invocation() Invocation {
	return Invocation{Args: []string{r.Binary}, Env: NVMLEnv(r.NVMLDir, r.Profile)}
}

// NVMLDevice is one GPU as NVML reports it.
type NVMLDevice struct {
	Index int `json:"index"`
	// BusID is NVML's form, with an 8-digit domain: 00000000:3B:00.0.
	BusID string `json:"busId"`
	// DeviceID and SubsystemID are packed as NVML packs them:
	// (device << 16) | vendor.
	DeviceID    uint32 `json:"pciDeviceId"`
	SubsystemID uint32 `json:"pciSubSystemId"`
	// PCIeRoot is what deviceattribute, the library the DRA drivers
	// publish PCIeRootAttribute with, finds for BusID in the sysfs
	// nvml-list sees; PCIeRootError says why it found none.
	PCIeRoot      string `json:"pcieRoot,omitempty"`
	PCIeRootError string `json:"pcieRootError,omitempty"`
	// What NVML reports of the board, where it answers: the name, and
	// brand and architecture in nvml-mock's profile names (lower case;
	// the stand-in reports neither), compute capability as major.minor,
	// the frame buffer's total bytes.
	Name              string `json:"name,omitempty"`
	Brand             string `json:"brand,omitempty"`
	Architecture      string `json:"architecture,omitempty"`
	ComputeCapability string `json:"computeCapability,omitempty"`
	MemoryBytes       uint64 `json:"memoryBytes,omitempty"`
}

// Address is the bus id in sysfs's form.
func (d NVMLDevice) Address() (pciaddr.Address, error) { return pciaddr.Parse(d.BusID) }

// ParseNVMLDevices reads nvml-list's standard output.
func ParseNVMLDevices(stdout []byte) ([]NVMLDevice, error) {
	var devices []NVMLDevice
	if err := json.Unmarshal(stdout, &devices); err != nil {
		return nil, fmt.Errorf("nvml-list output: %w", err)
	}
	return devices, nil
}

// NUMANodeAttribute is the standard attribute of a device's NUMA node.
const NUMANodeAttribute = "resource.kubernetes.io/numaNode"

// PublishesNUMANode reports whether the NVIDIA DRA driver's kubelet plugin
// at path names NUMANodeAttribute: a version that does publishes it on
// every GPU whose numa_node the tree gives; one that does not (the
// attribute's name is nowhere in its binary) publishes no NUMA attribute
// on a GPU, so the rows that match GPUs on it cannot be run.
func PublishesNUMANode(path string) (bool, error) {
	binary, err := os.ReadFile(path)
	if err != nil {
		return false, err
	}
	return bytes.Contains(binary, []byte(NUMANodeAttribute)), nil
}
