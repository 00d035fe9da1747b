package programs

// The recipes of a real single-node Kubernetes (kubetest): the control
// plane, the kubelet, etcd and nfd-master, all from the Go module proxy. Versions and build facts are those
// of ../shared/KUBERNETES.md and ../shared/third-party/README.md.

// KubeVersion is the Kubernetes release the cluster runs: the project's
// k8s.io/api is its staging module (v0.37.2).
const KubeVersion = "v1.37.2"

// kubeModuleDir holds the throwaway module that builds the four kube
// commands: k8s.io/kubernetes has replace directives, so go install
// refuses it, and a module of ours repeats its replace block.
const kubeModuleDir = "deploy/e2e/programs/testdata/kube/"

// etcdModuleDir holds the throwaway module that builds etcd (go install
// refuses it too, for the same reason).
const etcdModuleDir = "deploy/e2e/programs/testdata/etcd/"

// kubeCommands are the binaries Kube builds.
func kubeCommands() []string {
	return []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet"}
}

// Kube is kube-apiserver, kube-controller-manager, kube-scheduler and the
// kubelet at KubeVersion, static, built in one go build so that the
// packages they share compile once. The -X flags give them their version:
// without them they call themselves v0.0.0-master.
func Kube() Program {
	const version = "k8s.io/component-base/version."
	args := []string{"-ldflags", "-s -w -X " + version + "gitVersion=" + KubeVersion + " -X " + version + "gitMajor=1 -X " + version + "gitMinor=37", "-o", "{out}/"}
	for _, c := range kubeCommands() {
		args = append(args, "k8s.io/kubernetes/cmd/"+c)
	}
	return Program{
		Name:    "kube",
		Files:   moduleFiles(kubeModuleDir, "tools.go"),
		Steps:   []Step{goBuild(false, args...)},
		Outputs: kubeCommands(),
	}
}

// Etcd is etcd v3.7.3, the API server's only storage.
func Etcd() Program {
	return Program{
		Name:    "etcd",
		Files:   moduleFiles(etcdModuleDir, "tools.go"),
		Steps:   []Step{goBuild(false, "-ldflags", "-s -w", "-o", "{out}/etcd", "go.etcd.io/etcd/server/v3")},
		Outputs: []string{"etcd"},
	}
}

// NFDMaster is node-feature-discovery's master, which turns NodeFeature
// objects (GFD's, with --use-node-feature-api) into Node labels. It builds
// as NFDWorker does.
func NFDMaster() Program {
	return nfd("nfd-master")
}

// moduleFiles are a throwaway module's go.mod, go.sum and the named
// files, kept in the repository under dir.
func moduleFiles(dir string, files ...string) map[string]string {
	out := map[string]string{"go.mod": dir + "go.mod", "go.sum": dir + "go.sum"}
	for _, f := range files {
		out[f] = dir + f
	}
	return out
}
