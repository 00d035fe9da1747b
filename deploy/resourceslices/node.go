package resourceslices

import resourcev1 "k8s.io/api/resource/v1"

// ForNode returns the ResourceSlices every driver this package plans
// publishes on node for the profile data (source names it in refusals),
// driver by driver: what a node that runs no driver carries in their place.
// Today the NVIDIA DRA driver's alone; each driver this package learns
// joins here, and the publisher (deploy/publisher) publishes whatever it
// returns, grouped by driver and pool.
func ForNode(source string, data []byte, node string) ([]resourcev1.ResourceSlice, error) {
	return NVIDIAGPU(source, data, node)
}
