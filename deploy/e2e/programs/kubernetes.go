package programs

import "strings"

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

// KWOKVersion is the KWOK release whose controller fakes the kwok suite's
// nodes (deploy/e2e/kwok).
const KWOKVersion = "v0.8.0"

// KWOK is KWOK's controller, which keeps Nodes no kubelet runs alive
// (their leases and Ready condition) and moves the pods bound to them
// through their lifecycle by its Stages: the kubelet-less nodes of the
// kwok suite and its scale benchmark. Its module has no replace
// directive, so go install builds it. The controller has no stage of its
// own: kwokctl writes its "fast" ones (a node Ready at once, its lease
// renewed; a pod Running at once, deleted when asked) into its config.
// Those are KWOK's files at KWOKVersion, copied from the module into
// KWOKStages, not kept here.
func KWOK() Program {
	const mod = "sigs.k8s.io/kwok@" + KWOKVersion
	stages := []string{"node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
		"pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"}
	script := `set -eu
d=$(go mod download -json ` + mod + ` | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
for f in ` + strings.Join(stages, " ") + `; do echo "---"; cat "$d/kustomize/stage/$f"; done > {out}/` + KWOKStages + `
`
	return Program{
		Name: "kwok",
		Steps: []Step{
			goInstall("-ldflags", "-s -w", "sigs.k8s.io/kwok/cmd/kwok@"+KWOKVersion),
			{Args: []string{"sh", "-c", script}},
		},
		Outputs: []string{"kwok", KWOKStages},
	}
}

// KWOKStages is the file, beside the kwok binary, of the Stages its
// controller runs (kwok --config).
const KWOKStages = "stages.yaml"

// KWOKNodeAnnotation=KWOKNodeValue marks the Nodes KWOK's controller
// manages, as kwokctl runs it (--manage-nodes-with-annotation-selector)
// and KWOK's documentation makes its Nodes.
const KWOKNodeAnnotation, KWOKNodeValue = "kwok.x-k8s.io/node", "fake"
