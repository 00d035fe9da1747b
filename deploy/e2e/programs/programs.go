package programs

// The recipes of the programs a registry serves. Versions and build facts
// are those of ../shared/third-party/README.md; a recipe changes only with
// them.

// goBuild is a go build step into {out}; cgo is on only where the program
// needs it (NVML is loaded with dlopen through cgo).
func goBuild(cgo bool, args ...string) Step {
	env := []string{"CGO_ENABLED=0"}
	if cgo {
		env = []string{"CGO_ENABLED=1"}
	}
	return Step{Args: append([]string{"go", "build", "-trimpath"}, args...), Env: env}
}

// goInstall installs proxy modules at pinned versions into {out}; args are
// go install's: flags (such as -ldflags) first, then package@version.
func goInstall(args ...string) Step {
	return Step{Args: append([]string{"go", "install", "-trimpath"}, args...), Env: []string{"CGO_ENABLED=0", "GOBIN={out}", "GOFLAGS=-buildvcs=false"}}
}

// Containerd is containerd 2 with ctr and the runc shim.
func Containerd() Program {
	const v = "@v2.4.2"
	return Program{
		Name: "containerd",
		Steps: []Step{goInstall(
			"github.com/containerd/containerd/v2/cmd/containerd"+v,
			"github.com/containerd/containerd/v2/cmd/ctr"+v,
			"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"+v,
		)},
		Outputs: []string{"containerd", "ctr", "containerd-shim-runc-v2"},
	}
}

// Crictl is the CRI command-line client, which speaks to containerd as a
// kubelet does.
func Crictl() Program {
	return Program{
		Name:    "crictl",
		Steps:   []Step{goInstall("sigs.k8s.io/cri-tools/cmd/crictl@v1.37.0")},
		Outputs: []string{"crictl"},
	}
}

// NFDWorker is node-feature-discovery's worker, built with the /host-
// hostpath prefix as upstream's image is, so it reads
// /host-sys/bus/pci/devices.
func NFDWorker() Program {
	return nfd("nfd-worker")
}

// NFDModule and NFDVersion are node-feature-discovery's module, whose
// nfd-worker and nfd-master are built, and whose NodeFeature CRDs the
// Kubernetes suites apply (deployment/base/nfd-crds/nfd-api-crds.yaml).
const (
	NFDModule  = "sigs.k8s.io/node-feature-discovery"
	NFDVersion = "v0.19.0"
)

// nfd builds one command of node-feature-discovery v0.19.0 as upstream's
// image does (with the /host- hostpath prefix). The proxy serves the
// module but go install refuses it (replace directives), so it is copied
// out of the module cache and built in place, with its nested api module
// from the proxy.
func nfd(command string) Program {
	const mod, v = NFDModule, NFDVersion
	script := `set -eu
dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
d=$(dir ` + mod + `@` + v + `)
cp -a "$d"/. .
chmod -R u+w .
api=$(dir ` + mod + `/api/nfd@` + v + `)
go mod edit -replace ` + mod + `/api/nfd="$api"
go build -trimpath -ldflags "-X ` + mod + `/pkg/utils/hostpath.pathPrefix=/host-" -o {out}/` + command + ` ./cmd/` + command + `
`
	return Program{
		Name:    command,
		Steps:   []Step{{Args: []string{"sh", "-c", script}, Env: []string{"CGO_ENABLED=0", "GOFLAGS=-mod=mod -buildvcs=false"}}},
		Outputs: []string{command},
	}
}

// GHWList is a program of ours that prints what ghw v0.27.0's PCI() lists
// (its own module, with ghw from the proxy). See GHWListRun.
func GHWList() Program {
	return ourModule("ghw-list", false)
}

// NVMLList is a program of ours that loads libnvidia-ml.so.1 through
// go-nvml (the version GFD vendors) and prints each GPU's PCI identity.
// See NVMLListRun.
func NVMLList() Program {
	return ourModule("nvml-list", true)
}

// ourModule is a small module of ours under deploy/e2e/programs/testdata/name,
// built with its own go.mod and go.sum.
func ourModule(name string, cgo bool) Program {
	dir := "deploy/e2e/programs/testdata/" + name + "/"
	return Program{
		Name:    name,
		Files:   map[string]string{"go.mod": dir + "go.mod", "go.sum": dir + "go.sum", "main.go": dir + "main.go"},
		Steps:   []Step{goBuild(cgo, "-o", "{out}/"+name, ".")},
		Outputs: []string{name},
	}
}

// All lists every program the end-to-end suites build, in the order
// build-programs builds them: the quick ones first, so a cold run shows
// progress early, the Kubernetes node's (kubetest) last.
func All() []Program {
	return []Program{NVMLStandIn(), GHWList(), NVMLList(), Crictl(), GFD(), Helm(), NFDWorker(), Containerd(),
		Etcd(), NFDMaster(), Kube(), KWOK()}
}
