package programs

import "path/filepath"

// HelmModule and HelmVersion are the Helm CLI the chart tests run
// (helm lint, helm template on deploy/helm/nvml-mock-sysfs).
const (
	HelmModule  = "helm.sh/helm/v4"
	HelmVersion = "v4.3.2"
)

// Helm is the Helm CLI at HelmVersion. The module has no replace
// directives, so go install builds it from the proxy. Helm's own release
// build stamps its version with -X: without it `helm version` says only
// "v4.3", the default its source carries.
func Helm() Program {
	stamp := "-ldflags=-s -w -X " + HelmModule + "/internal/version.version=" + HelmVersion
	return Program{
		Name:    "helm",
		Steps:   []Step{goInstall(stamp, HelmModule+"/cmd/helm@"+HelmVersion)},
		Outputs: []string{"helm"},
	}
}

// HelmEnv is the environment of a helm run that keeps Helm's
// configuration, cache and data (repositories, plugins, registry logins)
// under dir rather than the user's home, and names no cluster: lint and
// template need neither, and a test must not read or change the user's.
func HelmEnv(dir string) []string {
	return []string{
		"HELM_CONFIG_HOME=" + filepath.Join(dir, "config"),
		"HELM_CACHE_HOME=" + filepath.Join(dir, "cache"),
		"HELM_DATA_HOME=" + filepath.Join(dir, "data"),
		"KUBECONFIG=" + filepath.Join(dir, "no-cluster"),
	}
}
