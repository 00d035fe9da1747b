package fidelity

import (
	"io/fs"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/sysfs"
)

// Report is the finding for every device checked.
type Report struct {
	Sysfs string `json:"sysfs"`
	Rows  []Row  `json:"rows"`
}

// CheckMachine checks every GPU and NVSwitch of a machine, as the profile
// describes them, in a sysfs tree (os.DirFS of /sys or <root>/sys).
func CheckMachine(sys fs.FS, m *profile.Machine) []Row {
	var rows []Row
	compiled := patterns{}
	for _, d := range m.Devices {
		rows = append(rows, check(sys, sysfs.LinksDir+"/"+d.Address.String(), ExpectFor(d), compiled)...)
	}
	return rows
}

// Failures returns the failing rows.
func (r *Report) Failures() []Row {
	var out []Row
	for _, x := range r.Rows {
		if x.Failing() {
			out = append(out, x)
		}
	}
	return out
}

// Count counts rows by status.
func (r *Report) Count(s Status) int {
	n := 0
	for _, x := range r.Rows {
		if x.Status == s {
			n++
		}
	}
	return n
}
