package resourceslices

import (
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
)

// ForNode returns the ResourceSlices every driver this package plans
// publishes on node for the profile data (source names it in refusals),
// driver by driver: the NVIDIA DRA driver's, then dranet's (none on a
// profile without HCAs). It is what a node that runs no driver carries in
// their place: the slices command prints it, and the publisher
// (deploy/publisher) publishes it, grouped by driver and pool.
func ForNode(source string, data []byte, node string) ([]resourcev1.ResourceSlice, error) {
	var out []resourcev1.ResourceSlice
	for _, driver := range []func(string, []byte, string) ([]resourcev1.ResourceSlice, error){NVIDIAGPU, DRANet} { // as Drivers lists them
		planned, err := driver(source, data, node)
		if err != nil {
			return nil, err
		}
		out = append(out, planned...)
	}
	return out, nil
}

// Drivers are the drivers ForNode plans slices of, in its order: those a
// publisher may find its slices of on a node.
func Drivers() []string { return []string{NVIDIAGPUDriver, DRANetDriver} }

// DriverOrder is the place of a driver's slices in ForNode's list (-1 for
// a driver it does not plan), for those who compare what an API server
// lists (by name) with it.
func DriverOrder(driver string) int { return slices.Index(Drivers(), driver) }
