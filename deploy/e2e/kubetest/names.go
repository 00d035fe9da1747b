package kubetest

import (
	"regexp"
	"strings"

	resourcev1 "k8s.io/api/resource/v1"
)

// notInSlug are the runs of characters a slug replaces by one '-', and
// dotInSlug the runs of '-' and '.' with a dot, which it makes one '.'
// (a DNS name has no "-." or "..").
var (
	notInSlug = regexp.MustCompile(`[^a-z0-9.-]+`)
	dotInSlug = regexp.MustCompile(`[-.]*\.[-.]*`)
)

// Slug is a name (a suite profile's, such as "built-in dgx-a100") as the
// suites write it where Kubernetes or a file system takes fewer
// characters: lower case, each run of anything but letters, digits, '.'
// and '-' one '-', each run of '-' and '.' with a dot one '.', and no '-'
// or '.' at either end. So it is at once a
// label value, a ConfigMap key, a DNS label's part of an object name and
// a directory name (the recorded runs' under overlay/resourceslices).
func Slug(name string) string {
	s := notInSlug.ReplaceAllString(strings.ToLower(name), "-")
	return strings.Trim(dotInSlug.ReplaceAllString(s, "."), "-.")
}

// StringAttribute is a device's string attribute by its name as the slice
// writes it (qualified or not), and whether it has one: false when the
// attribute is missing or not a string.
func StringAttribute(d resourcev1.Device, name string) (string, bool) {
	a, ok := d.Attributes[resourcev1.QualifiedName(name)]
	if !ok || a.StringValue == nil {
		return "", false
	}
	return *a.StringValue, true
}

// DRAUnschedulable is what the scheduler's DynamicResources plugin says of
// a node on which it found no allocation of the pod's claims, in the
// Unschedulable message (Unschedulable): "0/1 nodes are available: 1
// cannot allocate all claims. ..." A pod that must pend for its claims
// must pend for this reason, not another (a taint, a node not ready).
const DRAUnschedulable = "cannot allocate all claims"
