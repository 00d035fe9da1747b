package cdispec

import (
	"io/fs"
	"path"
	"slices"
	"strings"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

// MachineTypeFileEnv is the variable GPU Feature Discovery reads for its
// --machine-type-file (cmd/gpu-feature-discovery/main.go: EnvVars
// GFD_MACHINE_TYPE_FILE), whose one line it labels nvidia.com/gpu.machine.
// Set in the spec, it gives every served GFD the profile's machine with no
// flag added to its pod.
const MachineTypeFileEnv = "GFD_MACHINE_TYPE_FILE"

// Env is the one definition of the variables a served container gets
// beside the mounts: MachineTypeFileEnv at the overlay's machine-type file
// as the container sees it, when the render in root wrote one (a profile
// whose board names no machine, a PCIe card, gets none). Every channel
// takes its variables from here, as it takes its mounts from Mounts.
func Env(root fs.FS, containerRoot string) []string {
	info, err := fs.Stat(root, plan.ProductNameFile)
	if err != nil || !info.Mode().IsRegular() {
		return nil
	}
	return []string{MachineTypeFileEnv + "=" + path.Join(containerRoot, plan.ProductNameFile)}
}

// ours reports whether a variable is one Env defines, whatever its value.
func ours(v string) bool {
	name, _, _ := strings.Cut(v, "=")
	return name == MachineTypeFileEnv
}

// mergeEnv replaces our variables in env with want; the others stay.
func mergeEnv(env, want []string) []string {
	out := slices.DeleteFunc(slices.Clone(env), ours)
	out = append(out, want...)
	if len(out) == 0 {
		return nil
	}
	return out
}
