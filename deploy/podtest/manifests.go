package podtest

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// Manifests holds every object of a manifest directory (deploy/kubernetes),
// decoded strictly into its k8s.io/api type: an unknown or misspelt field
// fails the decode, as the API server's strict field validation does.
type Manifests struct {
	Namespaces          []corev1.Namespace
	DaemonSets          []appsv1.DaemonSet
	Deployments         []appsv1.Deployment
	ConfigMaps          []corev1.ConfigMap
	Pods                []corev1.Pod
	ServiceAccounts     []corev1.ServiceAccount
	ClusterRoles        []rbacv1.ClusterRole
	ClusterRoleBindings []rbacv1.ClusterRoleBinding
	Roles               []rbacv1.Role
	RoleBindings        []rbacv1.RoleBinding
	// The chart's admission policy of the publisher's account.
	ValidatingAdmissionPolicies       []admissionregistrationv1.ValidatingAdmissionPolicy
	ValidatingAdmissionPolicyBindings []admissionregistrationv1.ValidatingAdmissionPolicyBinding
}

// DecodeManifests decodes every document of every *.yaml file in dir.
func DecodeManifests(t testing.TB, dir string) *Manifests {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	m := &Manifests{}
	for _, f := range files {
		fh, err := os.Open(f)
		require.NoError(t, err)
		require.NoError(t, m.DecodeAll(fh), f)
		require.NoError(t, fh.Close())
	}
	return m
}

// DecodeAll decodes every document of a YAML stream (a file, or what helm
// template prints), skipping those that hold nothing but comments.
func (m *Manifests) DecodeAll(r io.Reader) error {
	docs := utilyaml.NewYAMLReader(bufio.NewReader(r))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := m.Decode(doc); err != nil {
			return err
		}
	}
}

// Decode decodes one document by its apiVersion and kind.
func (m *Manifests) Decode(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	switch tm.APIVersion + " " + tm.Kind {
	case " ": // nothing but comments, or blank
		return nil
	case "v1 Namespace":
		return decodeInto(doc, &m.Namespaces)
	case "apps/v1 DaemonSet":
		return decodeInto(doc, &m.DaemonSets)
	case "v1 ConfigMap":
		return decodeInto(doc, &m.ConfigMaps)
	case "v1 Pod":
		return decodeInto(doc, &m.Pods)
	case "v1 ServiceAccount":
		return decodeInto(doc, &m.ServiceAccounts)
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		return decodeInto(doc, &m.ClusterRoles)
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		return decodeInto(doc, &m.ClusterRoleBindings)
	case "apps/v1 Deployment":
		return decodeInto(doc, &m.Deployments)
	case "rbac.authorization.k8s.io/v1 Role":
		return decodeInto(doc, &m.Roles)
	case "rbac.authorization.k8s.io/v1 RoleBinding":
		return decodeInto(doc, &m.RoleBindings)
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
		return decodeInto(doc, &m.ValidatingAdmissionPolicies)
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
		return decodeInto(doc, &m.ValidatingAdmissionPolicyBindings)
	}
	return errors.New("unexpected object " + tm.APIVersion + " " + tm.Kind)
}

func decodeInto[T any](doc []byte, list *[]T) error {
	var obj T
	if err := yaml.UnmarshalStrict(doc, &obj); err != nil {
		return err
	}
	*list = append(*list, obj)
	return nil
}

// NodeArgs rewrites a container's --name=value args for a run on this
// machine rather than a node: --listen gets listen (a free port of the
// shared host network), and a value at or under a node path (a key of
// here) moves to where that path is here, so what the program writes and
// names (the CDI spec's host paths) is where this machine has it.
func NodeArgs(args []string, listen string, here map[string]string) []string {
	out := make([]string, 0, len(args))
	for _, a := range args {
		name, value, _ := strings.Cut(a, "=")
		if name == "--listen" {
			a = name + "=" + listen
		}
		for node, dir := range here {
			if rest, ok := strings.CutPrefix(value, node); ok && (rest == "" || strings.HasPrefix(rest, "/")) {
				a = name + "=" + dir + rest
			}
		}
		out = append(out, a)
	}
	return out
}

// FlagValue is the value of a container's --name=value argument, or "":
// the manifest's paths (--root, --output, --container-root) have one home.
func FlagValue(args []string, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	return ""
}

// FreeAddr is a loopback address with a port nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}
