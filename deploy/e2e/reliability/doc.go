// Package reliability holds the end-to-end tests that make the renderer safe
// to run from a restarting DaemonSet in front of containers that never stop
// reading: profile flips under live readers at the kernel path, SIGKILLed
// renders, concurrent renders, hostile profiles and planted symlinks. They
// drive the real binary; docs/evidence/reliability.md reports what they measured.
package reliability
