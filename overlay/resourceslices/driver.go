package resourceslices

import (
	"fmt"
	"slices"

	resourcev1 "k8s.io/api/resource/v1"
)

// A Driver is a DRA driver whose slices this package plans: what its
// kubelet plugin would publish on a node served a profile.
type Driver interface {
	// Name is the driver's name: its slices' spec.driver, and the
	// domain of its own attributes.
	Name() string
	// Slices are the ResourceSlices the driver publishes on node (never
	// empty) for p, none where p gives it no device.
	Slices(p *Profile, node string) ([]resourcev1.ResourceSlice, error)
}

// DefaultDrivers are the drivers this package plans, in the order a
// node's slices list them: the NVIDIA DRA driver's, then dranet's.
func DefaultDrivers() []Driver { return []Driver{NVIDIAGPU{}, DRANet{}} }

// Planner plans a node's slices, driver by driver. Its zero value plans
// DefaultDrivers'.
type Planner struct {
	// Drivers are the drivers planned, in the order their slices are
	// listed; none for DefaultDrivers.
	Drivers []Driver
}

func (pl Planner) drivers() []Driver {
	if len(pl.Drivers) == 0 {
		return DefaultDrivers()
	}
	return pl.Drivers
}

// ForNode returns the ResourceSlices every driver publishes on node for
// p, driver by driver in the Planner's order. It is what a node that runs
// no driver carries in their place: the slices command prints it, and the
// publisher (deploy/publisher) publishes it, grouped by driver and pool.
func (pl Planner) ForNode(p *Profile, node string) ([]resourcev1.ResourceSlice, error) {
	if node == "" {
		return nil, noNodeName(p.Source)
	}
	var out []resourcev1.ResourceSlice
	for _, d := range pl.drivers() {
		planned, err := d.Slices(p, node)
		if err != nil {
			return nil, err
		}
		out = append(out, planned...)
	}
	return out, nil
}

// DriverNames are the names of the drivers ForNode plans slices of, in
// its order: those a publisher may find its slices of on a node.
func (pl Planner) DriverNames() []string {
	var out []string
	for _, d := range pl.drivers() {
		out = append(out, d.Name())
	}
	return out
}

// DriverOrder is the place of a driver's slices in ForNode's list (-1 for
// a driver it does not plan), for those who compare what an API server
// lists (by name) with it.
func (pl Planner) DriverOrder(driver string) int { return slices.Index(pl.DriverNames(), driver) }

// ForNode returns the ResourceSlices the default drivers publish on node
// for the profile data (source names it in refusals): Parse, then
// Planner.ForNode, for a caller that needs the profile for nothing else.
func ForNode(source string, data []byte, node string) ([]resourcev1.ResourceSlice, error) {
	// Checked before the profile is read, whose refusal would hide it.
	if node == "" {
		return nil, noNodeName(source)
	}
	p, err := Parse(source, data)
	if err != nil {
		return nil, err
	}
	return Planner{}.ForNode(p, node)
}

// Drivers are the default drivers' names, Planner.DriverNames.
func Drivers() []string { return Planner{}.DriverNames() }

// DriverOrder is a driver's place among the default drivers,
// Planner.DriverOrder.
func DriverOrder(driver string) int { return Planner{}.DriverOrder(driver) }

// noNodeName refuses slices of no node: a slice's pool and nodeName are
// the node's.
func noNodeName(source string) error {
	return fmt.Errorf("profile %s: no node name for the ResourceSlices", source)
}
