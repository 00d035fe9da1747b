package dra_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// listAttributesGate is Kubernetes' and both drivers' gate of KEP-6072's
// list-typed attributes: with it, each driver publishes numaNode as a
// list ([node], dranet's followed by equally local nodes), and the
// scheduler matches lists by their intersection.
const listAttributesGate = "DRAListTypeAttributes=true"

// listAttributes reports whether the suite runs with listAttributesGate.
func (o suiteOptions) listAttributes() bool {
	return slices.Contains(o.featureGates, listAttributesGate)
}

// TestDRAListAttributes runs the first profile of the set with HCAs
// through TestDRA's every check on a node and drivers with list-typed
// attributes on: the same version of each driver, publishing numaNode in
// the other form. No check is tied to one form: each is judged by what the
// drivers published.
func TestDRAListAttributes(t *testing.T) {
	began := time.Now()
	var p programs.SuiteProfile
	for _, q := range programs.SuiteProfiles(t) {
		if q.Facts(t).HCAs {
			p = q
			break
		}
	}
	require.NotEmpty(t, p.File, "no profile of the set has HCAs")
	// Its own rows and objects directory: bin/k8s/<profile>-list-attributes/.
	p.Name += " list-attributes"
	profiles := []programs.SuiteProfile{p}
	// A driver of a version without the gate refuses it at its start: for
	// this suite, a driver with the gate is not supplied.
	if plugin, ok := programs.NeedSupplied(t, programs.GPUKubeletPlugin); ok {
		if refusal := gateRefused(plugin, listAttributesGate); refusal != "" {
			notRunDRA(t, profiles, func(row string) string {
				return programs.NotRun(row, programs.GPUKubeletPlugin) + " (one with the gate: the one supplied refuses " + listAttributesGate + ", " + refusal + ")"
			})
			return
		}
	}
	s := startSuite(t, profiles, suiteOptions{featureGates: []string{listAttributesGate}})
	if s == nil {
		return
	}
	t.Run(p.Name, func(t *testing.T) { s.profile(t, p) })
	s.appendMatrix(t, ", "+listAttributesGate+" on the node and both drivers", began)
}

// gateRefused is the driver's refusal of the feature gate, its own
// words, or "" where it takes the gate.
func gateRefused(plugin, gate string) string {
	out, _ := exec.Command(plugin, "--feature-gates="+gate, "--version").CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if _, refusal, ok := strings.Cut(line, "unrecognized feature gate: "); ok {
			return "unrecognized feature gate: " + refusal
		}
	}
	return ""
}
