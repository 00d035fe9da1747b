package capture_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/capture"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// FuzzNvidiaSMI feeds mangled captures through parsing and profile
// writing: neither may panic, a refusal is a *capture.Error or names the
// profile, and whatever is accepted normalises.
func FuzzNvidiaSMI(f *testing.F) {
	f.Add(synthCapture(gpu("00000000:06:00.0", "20B010DE", "134F10DE", "65536 MiB")))
	f.Add(synthCapture(gpu("00000000:00:1E.0", "1EB810DE", "12A210DE", "256 MiB"), gpu("00000000:00:1D.0", "1EB810DE", "12A210DE", "256 MiB")))
	f.Add(synthCapture(gpu("00000001:00:00.0", "0x20B510DE", "N/A", "N/A")))
	f.Fuzz(func(t *testing.T, xml string) {
		c, err := capture.ParseNvidiaSMI(strings.NewReader(xml), "fuzz.xml")
		if err != nil {
			var ie *capture.Error
			if !errors.As(err, &ie) {
				t.Fatalf("refusal is not a *capture.Error: %v", err)
			}
			return
		}
		for _, mode := range capture.RootComplexModes() {
			o := capture.DefaultOptions()
			o.RootComplexes = mode
			res, err := c.Profile(o)
			if err != nil {
				var ie *capture.Error
				var pe *profile.Error
				if !errors.As(err, &ie) && !errors.As(err, &pe) {
					t.Fatalf("refusal names neither the capture nor the profile: %v", err)
				}
				continue
			}
			if len(res.Machine.GPUs()) != len(c.GPUs) {
				t.Fatalf("%d GPUs in the capture, %d in the profile", len(c.GPUs), len(res.Machine.GPUs()))
			}
		}
	})
}
