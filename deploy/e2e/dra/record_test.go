package dra_test

// make docs re-records the real runs overlay/resourceslices is proven
// equal to (its TestRecordedRun): each driver's slices TestDRA judged, for
// each profile of the suite's own set, into
// overlay/resourceslices/testdata/<the driver's recorded run>/<profile>/.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

// recordSlices writes, under make docs (docmatrix.UpdateEnv), each
// driver's slices of the list judged (the API server's
// ResourceSliceList) as the recorded run of that driver for profile slug:
// by driver, each with its test of the node's own devices (nil: none),
// the NVIDIA driver's always, dranet's where it ran. Only a run
// of the release's defaults, unsabotaged, on one of the suite's own
// profiles records: another is not the run the plan is proven against.
// Each record is the list as recordOf keeps it.
func (s *suite) recordSlices(t *testing.T, literal, profileSlug string, judged []byte, drivers map[string]func(resourcev1.Device) bool) {
	t.Helper()
	if os.Getenv(docmatrix.UpdateEnv) != "1" || s.sabotage != "" || len(s.opts.featureGates) > 0 || s.opts.workers > 0 || literal == "" {
		return
	}
	var list resourcev1.ResourceSliceList
	require.NoError(t, json.Unmarshal(judged, &list), "the slices judged")
	runs := resourceslices.RecordedRuns()
	for driver, nodeOwn := range drivers {
		dir := filepath.Join(overlaytest.Repo(t), "overlay/resourceslices", runs[driver], profileSlug)
		require.NoError(t, os.MkdirAll(dir, 0o755))
		kubetest.WriteObject(t, dir, "resourceslices.json", recordOf(list, driver, nodeOwn))
		t.Logf("recorded %s's slices in %s", driver, dir)
	}
}

// recordOf is driver's slices of list as a record keeps them: what the
// driver published, so that recording the same driver on the same tree
// again changes no byte. Left out:
//   - what the API server stamps on each run: the list's
//     resourceVersion; each slice's name (its generateName stays), uid,
//     resourceVersion, generation, creationTimestamp and managedFields,
//     and the UID of its owner, the Node;
//   - the node's own devices (nodeOwn, where given: this machine's NICs
//     and virtual links, which dranet publishes beside the tree's), which
//     a node that runs nothing has not.
//
// Devices are sorted by name: the NVIDIA driver lists them from a Go map.
func recordOf(list resourcev1.ResourceSliceList, driver string, nodeOwn func(resourcev1.Device) bool) resourcev1.ResourceSliceList {
	out := resourcev1.ResourceSliceList{TypeMeta: list.TypeMeta, Items: []resourcev1.ResourceSlice{}}
	for _, item := range list.Items {
		if item.Spec.Driver != driver {
			continue
		}
		var owners []metav1.OwnerReference
		for _, o := range item.OwnerReferences {
			o.UID = ""
			owners = append(owners, o)
		}
		item.ObjectMeta = metav1.ObjectMeta{GenerateName: item.GenerateName, OwnerReferences: owners}
		if nodeOwn != nil {
			item.Spec.Devices = slices.DeleteFunc(slices.Clone(item.Spec.Devices), nodeOwn)
		}
		slices.SortFunc(item.Spec.Devices, func(a, b resourcev1.Device) int { return strings.Compare(a.Name, b.Name) })
		out.Items = append(out.Items, item)
	}
	return out
}
