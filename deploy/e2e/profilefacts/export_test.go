package profilefacts

import (
	"maps"
	"slices"
)

// LiteralNames are the profiles literals covers, for the test that finds
// and renders each.
func LiteralNames() []string { return slices.Sorted(maps.Keys(literals())) }
