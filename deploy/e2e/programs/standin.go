package programs

// The NVML stand-in: a libnvidia-ml.so.1 of our own (testdata/nvml-stand-in/
// nvml.c) that serves a profile's GPUs to GPU Feature Discovery and to
// nvml-list. nvml-mock's NVML is served by no registry (see
// ../shared/third-party/README.md), so it is only there when the user
// supplies it; the stand-in lets the NVML consumers' rows run without it.
// The library reads flat lines that WriteStandInConfig writes from the same
// profile the tree is rendered from, so NVML and sysfs name the same GPUs:
// from a file (StandInConfigEnv), or from the converter beside it
// (StandInConverter) run on nvml-mock's MOCK_NVML_CONFIG.
//
// GPU Feature Discovery itself, the stand-in's first consumer, is built
// from the module proxy (GFD).

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// StandInConfigEnv names a file of the flat lines the stand-in serves; it
// takes precedence over NVMLConfigEnv. nvml.c documents the format.
const StandInConfigEnv = "NVML_MOCK_SYSFS_STAND_IN"

// standInSource is the stand-in's C source in the repository.
const standInSource = "deploy/e2e/programs/testdata/nvml-stand-in/nvml.c"

// The buffers NVML's callers pass for a name or uuid
// (NVML_DEVICE_NAME_V2_BUFFER_SIZE) and a version, with the terminating
// NUL: the stand-in refuses longer strings, so the writer does first.
const (
	standInNameSize    = 96
	standInVersionSize = 80
)

// standInSourceName names the profile in WriteStandInConfig's refusals,
// which has no file name: its caller (the converter) adds it.
const standInSourceName = "for NVML"

// NVMLStandIn compiles the stand-in into {out}/libnvidia-ml.so.1 with the
// system C compiler: it needs libc alone, so it builds wherever cgo does.
func NVMLStandIn() Program {
	return Program{
		Name:  "nvml-stand-in",
		Files: map[string]string{"nvml.c": standInSource},
		// The soname and file name are NVML's: consumers dlopen it by that
		// name through LD_LIBRARY_PATH.
		Steps:   []Step{{Args: []string{"cc", "-shared", "-fPIC", "-O2", "-Wl,-soname," + MockNVML, "-o", "{out}/" + MockNVML, "nvml.c"}}},
		Outputs: []string{MockNVML},
	}
}

// GFDModule and GFDVersion are GPU Feature Discovery's module and the one
// version the module proxy offers.
const (
	GFDModule  = "github.com/NVIDIA/k8s-device-plugin"
	GFDVersion = "v0.17.4"
)

// GFD is GPU Feature Discovery, built from the module proxy (cgo on: it
// dlopens NVML through go-nvml). The module zip's vendor/ holds only
// modules.txt, and go install refuses a module with replace directives,
// so, as nfd does, it is copied out of the module cache and built in place
// with -mod=mod. Its requirement sigs.k8s.io/node-feature-discovery
// v0.15.7 is refused by the proxy; v0.15.4 is served and still has the two
// packages GFD imports (v0.16 and later moved them), so a replace points
// there. About 2.5 minutes on a cold module and build cache (2 CPUs).
func GFD() Program {
	const nfd = "sigs.k8s.io/node-feature-discovery"
	// An empty Dir (the proxy refusing the module) must stop the build:
	// cp -a "/." . would copy the machine's root.
	script := `set -eu
dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
d=$(dir ` + GFDModule + `@` + GFDVersion + `)
[ -n "$d" ] || { echo "go mod download ` + GFDModule + `@` + GFDVersion + ` gave no directory" >&2; exit 1; }
cp -a "$d"/. .
chmod -R u+w .
go mod edit -replace ` + nfd + `=` + nfd + `@v0.15.4
go build -trimpath -o {out}/gpu-feature-discovery ./cmd/gpu-feature-discovery
`
	return Program{
		Name:    "gpu-feature-discovery",
		Steps:   []Step{{Args: []string{"sh", "-c", script}, Env: []string{"CGO_ENABLED=1", "GOFLAGS=-mod=mod -buildvcs=false"}}},
		Outputs: []string{"gpu-feature-discovery"},
	}
}

// WriteStandInConfig writes to path the stand-in's lines for the nvml-mock
// profile nvmlProfile (see StandInConfig). Its refusals name the profile
// "for NVML": the caller names the file.
func WriteStandInConfig(path string, nvmlProfile []byte) error {
	out, err := StandInConfig(standInSourceName, nvmlProfile)
	if err != nil {
		return err
	}
	return os.WriteFile(path, out, 0o644)
}

// StandInConfig renders the stand-in's lines for the nvml-mock profile
// data (source names it in refusals). The stand-in serves a profile as
// nvml-mock's NVML does, so that a suite runs either alike:
//
//   - the GPUs, their order, bus ids and PCI ids are profile.NVMLGPUs's, the
//     product's model of nvml-mock's engine: devices 0..n-1 by index (n
//     from system.num_devices or devices[], at most profile.NVMLMaxDevices),
//     GPUs bound to vfio-pci included (NVMLProfile drops them, for either
//     NVML), and a subsystem of 0 where the profile gives none;
//   - uuid and minor_number are the profile's, else those ServableProfile
//     gives (profile.IdentifyDevices), so a GPU has the same uuid under both;
//   - the name is the profile's, else the name of the board its device id
//     is known by;
//   - memory, compute capability and MIG capability are the profile's; a
//     profile without them gets 0, which the stand-in reports as "not
//     supported" (memory) or no architecture, and GFD labels neither;
//   - the driver version and CUDA are profile.NVMLFields's: the profile's,
//     else nvml-mock's defaults.
//
// A GPU with MIG enabled is refused: the stand-in serves no MIG devices.
func StandInConfig(source string, data []byte) ([]byte, error) {
	_, gpus, nv, err := profile.ParseNVML(source, data)
	if err != nil {
		return nil, err
	}
	driver := nv.DriverVersion()
	if strings.ContainsFunc(driver, isSpaceOrControl) || len(driver) >= standInVersionSize {
		return nil, refuse(source, "system.driver_version", driver, "want one version such as 550.163.01")
	}
	cuda, err := nv.CUDAVersion(source)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	b.WriteString("# The NVML stand-in's GPUs, from an nvml-mock profile (WriteStandInConfig; nvml.c documents the format).\n")
	fmt.Fprintf(&b, "driver %s\ncuda %d\n", driver, cuda)
	def := nv.DeviceDefaults
	for _, g := range gpus {
		d, pos, _ := nv.Device(g.Index)
		// field names where a value came from, for a refusal.
		field := func(name string, own bool) string {
			if own {
				return fmt.Sprintf("devices[%d].%s", pos, name)
			}
			return "device_defaults." + name
		}
		name := cmp.Or(d.Name, def.Name)
		if name == "" {
			if board, ok := boards.Find("", uint16(g.DeviceID>>16)); ok {
				name = board.Name
			}
		}
		if name == "" || strings.ContainsFunc(name, isControl) || len(name) >= standInNameSize {
			return nil, refuse(source, field("name", d.Name != ""), name, fmt.Sprintf("want the GPU's product name, one line shorter than %d bytes (a board known by its device id gives one)", standInNameSize))
		}
		if d.UUID == "" || strings.ContainsFunc(d.UUID, isSpaceOrControl) || len(d.UUID) >= standInNameSize {
			return nil, refuse(source, field("uuid", true), d.UUID, fmt.Sprintf("want a uuid without spaces, shorter than %d bytes", standInNameSize))
		}
		memory := firstOf(d.Memory.TotalBytes, def.Memory.TotalBytes)
		cc := d.ComputeCapability
		if cc.Major == nil && cc.Minor == nil {
			cc = def.ComputeCapability
		}
		major, minor := firstOf(cc.Major, nil), firstOf(cc.Minor, nil)
		ownCC := d.ComputeCapability.Major != nil || d.ComputeCapability.Minor != nil
		if major < 0 || minor < 0 || major > 1000 || minor > 1000 {
			return nil, refuse(source, field("compute_capability", ownCC), fmt.Sprintf("%d.%d", major, minor), "want a major and a minor of 0..1000")
		}
		mig := firstOf(d.MIG.MaxGPUInstances, def.MIG.MaxGPUInstances)
		if mig < 0 || mig > 1000 {
			return nil, refuse(source, field("mig.max_gpu_instances", d.MIG.MaxGPUInstances != nil), strconv.Itoa(mig), "want 0 (not MIG capable) to 1000")
		}
		if mode := cmp.Or(d.MIG.ModeCurrent, def.MIG.ModeCurrent); strings.EqualFold(mode, "enabled") {
			return nil, refuse(source, field("mig.mode_current", d.MIG.ModeCurrent != ""), mode, "the NVML stand-in serves no MIG devices: want disabled")
		}
		fmt.Fprintf(&b, "gpu %s 0x%08X 0x%08X %d %d %d %d %d %s %s\n",
			g.BusID, g.DeviceID, g.SubsystemID, memory, major, minor, mig, d.Minor(), d.UUID, name)
	}
	return []byte(b.String()), nil
}

// refuse is the profile package's one-line refusal, for the fields only
// NVML reads.
func refuse(source, field, value, why string) error {
	return &profile.Error{Source: source, Field: field, Value: value, Err: errors.New(why)}
}

// firstOf is the device's own value, else the default's, else zero.
func firstOf[T any](own, def *T) T {
	switch {
	case own != nil:
		return *own
	case def != nil:
		return *def
	}
	var zero T
	return zero
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func isSpaceOrControl(r rune) bool { return r == ' ' || isControl(r) }
