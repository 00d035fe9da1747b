package boards_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
)

// TestLookupHCA pins the HCA table to Mellanox's numbering, the MT number
// being the PCI device id in decimal, and the refusal of any other value to
// name the value and the types that are known.
func TestLookupHCA(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		hcaType string
		name    string
		device  uint16
		gen     int
		err     string
	}{
		{hcaType: "MT4129", name: "ConnectX-7", device: 0x1021, gen: 5},
		{hcaType: "MT4131", name: "ConnectX-8", device: 0x1023, gen: 6},
		{hcaType: "MT4133", name: "ConnectX-9", device: 0x1025, gen: 6},
		{hcaType: " mt4133 ", name: "ConnectX-9", device: 0x1025, gen: 6},
		{hcaType: "MT4123", name: "ConnectX-6", device: 0x101b, gen: 4},
		{hcaType: "MT4135", err: `"MT4135": unknown HCA type: want one of MT4119 (ConnectX-5), `},
		{hcaType: "ConnectX-9", err: `"ConnectX-9": unknown HCA type: want one of `},
		{hcaType: "4133", err: `"4133": unknown HCA type`},
		{hcaType: "", err: `"": unknown HCA type`},
	} {
		t.Run(tc.hcaType, func(t *testing.T) {
			h, err := boards.LookupHCA(tc.hcaType)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				var unknown *boards.UnknownHCAError
				require.True(t, errors.As(err, &unknown))
				require.Equal(t, tc.hcaType, unknown.Type)
				require.Contains(t, unknown.Known, "MT4133 (ConnectX-9)")
				require.NotContains(t, unknown.Reason(), tc.hcaType+`"`, "Reason leaves the value to the caller")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.name, h.Name)
			require.Equal(t, tc.device, h.Device)
			require.Equal(t, tc.gen, h.LinkGen)
			require.Equal(t, 16, h.LinkWidth)
		})
	}
}
