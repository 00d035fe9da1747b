package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// readmeCommands returns the README's Commands block as command name ->
// synopsis, continuation lines joined and spaces collapsed.
func readmeCommands(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(data), "\n## Commands\n")
	require.True(t, ok, "README has a Commands section")
	_, rest, ok = strings.Cut(rest, "```\n")
	require.True(t, ok)
	block, _, ok := strings.Cut(rest, "```\n")
	require.True(t, ok)
	out := map[string]string{}
	var last string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		if strings.HasPrefix(line, " ") {
			require.NotEmpty(t, last, "a continuation line with nothing to continue: %q", line)
			out[last] += " " + strings.TrimSpace(line)
			continue
		}
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 2, line)
		require.Equal(t, "nvml-mock-sysfs", f[0], line)
		last = f[1]
		out[last] = strings.Join(f[2:], " ")
	}
	for name, s := range out {
		out[name] = strings.Join(strings.Fields(s), " ")
	}
	return out
}

var flagName = regexp.MustCompile(`--[a-z][a-z-]*`)

// The README's Commands block, each command's usage line and its flag set
// say the same: the block is each usage line, and each usage line names
// every flag the command has and no other, so none of them can drift.
func TestReadmeCommandsMatchTheFlagSets(t *testing.T) {
	t.Parallel()
	readme := readmeCommands(t)
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
		t.Run(c.name, func(t *testing.T) {
			code, help, stderr := runCLI(t, c.name, "-h")
			require.Equal(t, exitOK, code, stderr)
			usage, _, _ := strings.Cut(help, "\n")
			synopsis, ok := strings.CutPrefix(usage, "Usage: nvml-mock-sysfs "+c.name+" ")
			require.True(t, ok, usage)
			require.Equal(t, synopsis, readme[c.name], "README's Commands block against %s -h", c.name)

			var defined []string
			for _, line := range strings.Split(help, "\n") {
				if rest, ok := strings.CutPrefix(line, "  --"); ok {
					name, _, _ := strings.Cut(rest, " ")
					defined = append(defined, "--"+name)
				}
			}
			named := flagName.FindAllString(synopsis, -1)
			slices.Sort(named)
			named = slices.Compact(named)
			require.Equal(t, defined, named, "flags of %s against its usage line", c.name)
		})
	}
	for name := range readme {
		require.Contains(t, names, name, "the README lists a command that does not exist")
	}
}
