// Command ghw-list prints the PCI devices that ghw.PCI() finds, as a JSON
// array on standard output: ghw (used by the SR-IOV device plugin, dranet
// and koordinator) empties its whole list over one entry it cannot parse,
// so the list is the evidence that a served tree reads as a real one.
//
// Names come from pci.ids when the machine has it; without it ghw still
// lists every device with its ids, and so does this program.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/jaypipes/ghw"
	"github.com/jaypipes/pcidb"
)

// device is the part of ghw's pci.Device that identifies a function and
// its place in the tree. ghw's own JSON would carry each vendor's whole
// product list from pci.ids. consumers.GHWDevice reads it: this module is
// built on its own, so it cannot share the type.
type device struct {
	Address       string `json:"address"`
	ParentAddress string `json:"parentAddress"`
	Vendor        string `json:"vendor"`
	Product       string `json:"product"`
	Class         string `json:"class"`
	Subclass      string `json:"subclass"`
	ProgIf        string `json:"progIf"`
	Revision      string `json:"revision"`
	Driver        string `json:"driver"`
}

func main() {
	devices, err := list()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ghw-list:", err)
		os.Exit(1)
	}
	out, err := json.MarshalIndent(devices, "", "  ")
	if err != nil {
		fmt.Fprintln(os.Stderr, "ghw-list:", err)
		os.Exit(1)
	}
	fmt.Println(string(out))
}

func list() ([]device, error) {
	db, err := pcidb.New()
	if err != nil {
		// No pci.ids (a slim container): ids without names.
		db = &pcidb.PCIDB{}
	}
	info, err := ghw.PCI(ghw.WithPCIDB(db))
	if err != nil {
		return nil, fmt.Errorf("ghw.PCI: %w", err)
	}
	devices := []device{}
	for _, d := range info.Devices {
		x := device{Address: d.Address, ParentAddress: d.ParentAddress, Revision: d.Revision, Driver: d.Driver}
		if d.Vendor != nil {
			x.Vendor = d.Vendor.ID
		}
		if d.Product != nil {
			x.Product = d.Product.ID
		}
		if d.Class != nil {
			x.Class = d.Class.ID
		}
		if d.Subclass != nil {
			x.Subclass = d.Subclass.ID
		}
		if d.ProgrammingInterface != nil {
			x.ProgIf = d.ProgrammingInterface.ID
		}
		devices = append(devices, x)
	}
	return devices, nil
}
