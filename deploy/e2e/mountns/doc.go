// Package mountns holds end-to-end tests that mount a rendered overlay the
// way a container gets it, in a private mount namespace of this machine
// (the overlay at /opt/nvml-mock, its links directory over
// /sys/bus/pci/devices), and run the real consumers there: lspci, lstopo,
// go-nvlib and deviceattribute. They need root, unshare, lspci and
// lstopo-no-graphics, and skip saying which is missing.
package mountns
