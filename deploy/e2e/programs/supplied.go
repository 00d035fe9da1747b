package programs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SuppliedEnv names the directory of the programs no registry serves, which
// whoever runs the tests supplies by their upstream file names. The suites
// run their rows for each program found there; without it those rows say
// "not run", and make test's closing line counts them.
const SuppliedEnv = "NVML_MOCK_SYSFS_PROGRAMS"

// The supplied programs, by their upstream file names.
const (
	// MockNVML is nvml-mock's NVML library; where it is absent, GFD and
	// nvml-list load our stand-in (NVMLStandIn) and their rows say so.
	MockNVML = "libnvidia-ml.so.1"
	// NvmlMockNRI is nvml-mock's NRI plugin.
	NvmlMockNRI = "nvml-mock-nri"
	// RenderPCISysfs is nvml-mock's own renderer, whose trees a switch-over
	// must refuse to mix with ours.
	RenderPCISysfs = "render-pci-sysfs"
	// GPUKubeletPlugin is the NVIDIA DRA driver's kubelet plugin.
	GPUKubeletPlugin = "gpu-kubelet-plugin"
	// KubevirtGPUDevicePlugin is the GPU Operator's sandbox device plugin.
	KubevirtGPUDevicePlugin = "kubevirt-gpu-device-plugin"
	// DeviceInjector is containerd's NRI sample plugin that injects CDI
	// devices or mounts by pod annotation.
	DeviceInjector = "device-injector"
	// Dranet is the DRA driver for network devices.
	Dranet = "dranet"
	// DRADriverSRIOV is k8snetworkplumbingwg's DRA driver for SR-IOV
	// virtual functions, its kubelet plugin.
	DRADriverSRIOV = "dra-driver-sriov"
	// DRADriverChart is the NVIDIA DRA driver's Helm chart, a directory,
	// as its project keeps it (deployments/helm/dra-driver-nvidia-gpu).
	DRADriverChart = "dra-driver-nvidia-gpu"
	// DRADriverPrestart is the script the driver's image runs in its
	// kubelet plugin's init container (its project's hack/).
	DRADriverPrestart = "kubelet-plugin-prestart.sh"
)

// suppliedDir reports whether the supplied name is a directory, not a
// file.
func suppliedDir(name string) bool { return name == DRADriverChart }

// SuppliedNames are every program a suite may take from SuppliedEnv.
func SuppliedNames() []string {
	return []string{MockNVML, NvmlMockNRI, RenderPCISysfs, GPUKubeletPlugin, KubevirtGPUDevicePlugin, DeviceInjector, Dranet, DRADriverSRIOV, DRADriverChart, DRADriverPrestart}
}

// NotRunPrefix starts the line a suite logs for each row it could not run
// because its program was not supplied; make test's closing line counts
// these lines (.ci/testsummary.go).
const NotRunPrefix = "not run: "

// NotSuppliedError is a program that is not in the supplied directory.
type NotSuppliedError struct {
	Program string
	// Dir is the directory looked in; empty when SuppliedEnv is unset.
	Dir string
	Err error
}

func (e *NotSuppliedError) Error() string {
	if e.Dir == "" {
		return fmt.Sprintf("%s not supplied (%s is unset)", e.Program, SuppliedEnv)
	}
	return fmt.Sprintf("%s not supplied (%s: %v)", e.Program, SuppliedEnv, e.Err)
}

func (e *NotSuppliedError) Unwrap() error { return e.Err }

// Supplied finds the programs that whoever runs the tests supplies. The
// zero value reads SuppliedEnv.
type Supplied struct {
	// Dir holds the programs by their upstream file names; empty means
	// $NVML_MOCK_SYSFS_PROGRAMS.
	Dir string
}

func (s Supplied) dir() string {
	if s.Dir != "" {
		return s.Dir
	}
	return os.Getenv(SuppliedEnv)
}

// Path returns the absolute path of the supplied program name, or a
// *NotSuppliedError. A program must be a regular file (a link to one is
// followed), and executable unless it is a library or a script its
// caller runs with its shell; a chart must be a directory.
func (s Supplied) Path(name string) (string, error) {
	dir := s.dir()
	if dir == "" {
		return "", &NotSuppliedError{Program: name}
	}
	p, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		return "", &NotSuppliedError{Program: name, Dir: dir, Err: err}
	}
	info, err := os.Stat(p)
	switch {
	case err != nil:
		return "", &NotSuppliedError{Program: name, Dir: dir, Err: err}
	case suppliedDir(name):
		if !info.IsDir() {
			return "", &NotSuppliedError{Program: name, Dir: dir, Err: fmt.Errorf("%s is a %s, not a directory", p, info.Mode().Type())}
		}
		return p, nil
	case !info.Mode().IsRegular():
		return "", &NotSuppliedError{Program: name, Dir: dir, Err: fmt.Errorf("%s is a %s, not a file", p, info.Mode().Type())}
	case !strings.Contains(name, ".so") && !strings.HasSuffix(name, ".sh") && info.Mode().Perm()&0o111 == 0:
		return "", &NotSuppliedError{Program: name, Dir: dir, Err: fmt.Errorf("%s is not executable", p)}
	}
	return p, nil
}

// Describe says which programs are supplied and which are not, in one
// line, for build-programs' progress.
func (s Supplied) Describe() (string, error) {
	var have, lack []string
	for _, name := range SuppliedNames() {
		_, err := s.Path(name)
		var missing *NotSuppliedError
		switch {
		case err == nil:
			have = append(have, name)
		case errors.As(err, &missing) && (missing.Err == nil || errors.Is(missing.Err, fs.ErrNotExist)):
			lack = append(lack, name)
		default:
			return "", err
		}
	}
	line := fmt.Sprintf("supplied (%s=%q): %s", SuppliedEnv, s.dir(), strings.Join(have, ", "))
	if len(have) == 0 {
		line = fmt.Sprintf("supplied (%s=%q): none", SuppliedEnv, s.dir())
	}
	if len(lack) > 0 {
		line += "; their rows say not run without: " + strings.Join(lack, ", ")
	}
	return line, nil
}

// NeedSupplied returns the path of the supplied program name, or false
// where it is absent: the caller then reports each row it does not run
// (NotRun, docmatrix.Rows.NotRun). A program that is there but unusable
// (not a file, not executable) fails the test: only absence is "not run".
// Under -short it skips, as Need does.
func NeedSupplied(t testing.TB, name string) (string, bool) {
	t.Helper()
	SkipShort(t)
	p, err := Supplied{}.Path(name)
	if err == nil {
		return p, true
	}
	var missing *NotSuppliedError
	if errors.As(err, &missing) && (missing.Err == nil || errors.Is(missing.Err, fs.ErrNotExist)) {
		return "", false
	}
	t.Fatal(err)
	return "", false
}

// NotRun is the line a test logs, and the matrix cell, of a row not run
// because the program name was not supplied; make test's closing line
// counts these lines.
func NotRun(row, name string) string {
	return fmt.Sprintf("%s%s not supplied: %s", NotRunPrefix, name, row)
}
