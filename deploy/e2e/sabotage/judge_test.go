package sabotage_test

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// TestJudge holds judge to its rule on a suite of three rows, the second
// of which the sabotage must turn red and the third of which a full run
// leaves –: each way a run can pass without judging must be wrong,
// a suite that stops at its first row first (the sabotage suite's own
// negative control).
func TestJudge(t *testing.T) {
	fake := suite{
		cells:     []string{"first", "second", "third"},
		unchecked: []string{"third"},
		red:       map[string][]string{programs.SabotageNoTree: {"second"}},
	}
	const header = "| row | result |\n|---|---|\n"
	for name, tc := range map[string]struct {
		table string
		wrong []string
	}{
		"as it must be": {table: "| first | ✓ a |\n| second | ✗ b |\n| third | – |\n"},
		"the red cell's program not supplied": {
			table: "| first | ✓ a |\n| second | not run: dranet not supplied: x |\n| third | – |\n"},
		"every program not supplied": {
			table: "| first | not run: gpu-kubelet-plugin not supplied: x |\n| second | not run: gpu-kubelet-plugin not supplied: x |\n| third | not run: gpu-kubelet-plugin not supplied: x |\n"},
		"stops at its first row": {table: "| first | ✓ a |\n",
			wrong: []string{"missing (the suite stopped before it): second", "missing (the suite stopped before it): third"}},
		"stops at its first row, red": {table: "| first | ✗ a |\n",
			wrong: []string{"missing (the suite stopped before it): second", "missing (the suite stopped before it): third", "red, must stay green: first"}},
		"the red cell not checked": {table: "| first | ✓ a |\n| second | – |\n| third | – |\n",
			wrong: []string{"not judged, must turn red: second"}},
		"the red cell not run for another reason": {table: "| first | ✓ a |\n| second | not run: the driver stops: x |\n| third | – |\n",
			wrong: []string{"not judged, must turn red: second"}},
		"the red cell green": {table: "| first | ✓ a |\n| second | ✓ b |\n| third | – |\n",
			wrong: []string{"green, must turn red: second"}},
		"a green cell not checked": {table: "| first | – not judged: why |\n| second | ✗ b |\n| third | – |\n",
			wrong: []string{"not judged, must be green: first"}},
		"an unchecked cell red": {table: "| first | ✓ a |\n| second | ✗ b |\n| third | ✗ c |\n",
			wrong: []string{"red, must stay green: third"}},
		"a cell the table does not name, red": {table: "| first | ✓ a |\n| second | ✗ b |\n| third | – |\n| fourth | ✗ d |\n",
			wrong: []string{"red, must stay green: fourth"}},
		"no verdict": {table: "", wrong: []string{"no verdict in its matrix"}},
	} {
		t.Run(name, func(t *testing.T) {
			got := judge(fake, programs.SabotageNoTree, docmatrix.ReadVerdicts(header+tc.table))
			require.Equal(t, tc.wrong, got)
		})
	}
}

// TestSuitesNameTheirCells: every cell a suite must turn red is one of
// the cells it must write, so that a misspelt name cannot pass by being
// written by no suite.
func TestSuitesNameTheirCells(t *testing.T) {
	for _, s := range suites(t) {
		for sabotage, red := range s.red {
			for _, c := range red {
				require.True(t, slices.Contains(s.cells, c), "%s, %s: the red cell %q is not among its cells", s.name, sabotage, c)
			}
		}
	}
}
