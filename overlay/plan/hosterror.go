package plan

// HostDevicesError is a mock device that the host's own devices, merged
// into the plan (Options.HostDevices), leave no room for. Its remedy names
// the option, not a flag: the command line adds its flag's name.
type HostDevicesError struct {
	// Reason says which mock device and which host device clash.
	Reason string
}

func (e *HostDevicesError) Error() string {
	return e.Reason + ": move the mock device, or do not merge the host's devices"
}
