package kubetest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// ApplyFieldManager is the field manager of the objects Apply makes, as
// kubectl's is "kubectl".
const ApplyFieldManager = "nvml-mock-sysfs-test"

// Apply applies every document of a YAML file as `kubectl apply
// --server-side` does: the file's own bytes go to the API server as an
// apply patch, with strict field validation, so the server (not a local
// decode) decides that each object is valid and has no unknown field.
// Kinds the API server learnt since the last call (CRDs) are found. It
// returns the objects as the server stored them.
func (c *Cluster) Apply(t testing.TB, file string) []*unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return c.ApplyYAML(t, file, data)
}

// ApplyYAML is Apply of data, named name in failures.
func (c *Cluster) ApplyYAML(t testing.TB, name string, data []byte) []*unstructured.Unstructured {
	t.Helper()
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(c.Client.Discovery()))
	var out []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 1; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, i, err)
		}
		if strings.TrimSpace(string(doc)) == "" {
			continue
		}
		obj, err := c.applyDoc(dyn, mapper, doc)
		if err != nil {
			t.Fatalf("%s: document %d: %v", name, i, err)
		}
		out = append(out, obj)
	}
}

func (c *Cluster) applyDoc(dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, doc []byte) (*unstructured.Unstructured, error) {
	var obj unstructured.Unstructured
	if err := yaml.Unmarshal(doc, &obj.Object); err != nil {
		return nil, err
	}
	gvk := obj.GroupVersionKind()
	mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		// A kind a CRD of this file or an earlier call added.
		mapper.Reset()
		mapping, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, obj.GetName(), err)
	}
	var client dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		client = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	}
	force := true
	applied, err := client.Patch(context.Background(), obj.GetName(), types.ApplyYAMLPatchType, doc, metav1.PatchOptions{
		FieldManager: ApplyFieldManager, FieldValidation: metav1.FieldValidationStrict, Force: &force,
	})
	if err != nil {
		return nil, fmt.Errorf("apply %s %s/%s: %w", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
	}
	return applied, nil
}
