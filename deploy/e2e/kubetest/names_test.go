package kubetest

import (
	"testing"

	"github.com/stretchr/testify/require"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"
)

// TestSlug: the suites' profile names as label values and object names,
// the recorded runs' directories unchanged (built-in-dgx-a100).
func TestSlug(t *testing.T) {
	for name, want := range map[string]string{
		"built-in dgx-a100":                 "built-in-dgx-a100",
		"built-in dgx-a100 list-attributes": "built-in-dgx-a100-list-attributes",
		"shared a100":                       "shared-a100",
		"vfio-passthrough":                  "vfio-passthrough",
		"extra My_Board  (v2).yaml":         "extra-my-board-v2.yaml",
		"_x.":                               "x",
		"a..b -.c":                          "a.b.c",
	} {
		got := Slug(name)
		require.Equal(t, want, got, "Slug(%q)", name)
		require.Empty(t, validation.IsValidLabelValue(got), "%q as a label value", got)
		require.Empty(t, validation.IsDNS1123Subdomain("gfd-"+got), "%q in an object name", got)
	}
}

// TestStringAttribute: a string attribute by its name; none for a missing
// or an integer one.
func TestStringAttribute(t *testing.T) {
	d := resourcev1.Device{Attributes: map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{
		"productName":                     {StringValue: ptr.To("NVIDIA H100 80GB HBM3")},
		"resource.kubernetes.io/numaNode": {IntValue: ptr.To[int64](1)},
	}}
	got, ok := StringAttribute(d, "productName")
	require.True(t, ok)
	require.Equal(t, "NVIDIA H100 80GB HBM3", got)
	for _, name := range []string{"resource.kubernetes.io/numaNode", "resource.kubernetes.io/pcieRoot"} {
		_, ok := StringAttribute(d, name)
		require.False(t, ok, name)
	}
}
