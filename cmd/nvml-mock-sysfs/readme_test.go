package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// commandsPage is the page with the Commands block, which the README
// links.
const commandsPage = "../../docs/reference/commands.md"

// pageCommands returns the Commands block of docs/reference/commands.md as command
// name -> synopsis, continuation lines joined and spaces collapsed.
func pageCommands(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(commandsPage)
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(data), "# Commands\n")
	require.True(t, ok, "%s has a Commands heading", commandsPage)
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

// The Commands block of docs/reference/commands.md, each command's usage line and
// its flag set say the same: the block is each usage line, and each usage
// line names every flag the command has and no other, so none of them can
// drift.
func TestCommandsPageMatchesTheFlagSets(t *testing.T) {
	t.Parallel()
	page := pageCommands(t)
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
		t.Run(c.name, func(t *testing.T) {
			code, help, stderr := runCLI(t, c.name, "-h")
			require.Equal(t, exitOK, code, stderr)
			usage, _, _ := strings.Cut(help, "\n")
			synopsis, ok := strings.CutPrefix(usage, "Usage: nvml-mock-sysfs "+c.name+" ")
			require.True(t, ok, usage)
			require.Equal(t, synopsis, page[c.name], "%s's Commands block against %s -h", commandsPage, c.name)

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
	for name := range page {
		require.Contains(t, names, name, "%s lists a command that does not exist", commandsPage)
	}
}

// The README's quick start, as a newcomer types it.
const (
	readmeQuickStart = `make build && ./bin/nvml-mock-sysfs render --root "$PWD/_out" && ./bin/nvml-mock-sysfs compat --root "$PWD/_out"`
	readmeMakeTest   = "make test"
)

// Every command the README shows is checked by a test: its shell blocks
// are the quick start (its render and compat are TestRenderThenCompat; its
// make targets are checked here), the Kubernetes quick start (deploy's
// TestReadmeKubernetesQuickStart, and the Kubernetes suite, which runs it
// step for step) and the fleet (deploy's TestHelmDocsInstallTheChart
// renders its helm install; TestFleet checks its label and the labels it
// lists are the ones it judges).
func TestReadmeShowsOnlyCheckedCommands(t *testing.T) {
	t.Parallel()
	blocks := overlaytest.ReadmeShell(t)
	var sections []string
	for s := range blocks {
		sections = append(sections, s)
	}
	require.ElementsMatch(t, []string{"Quick start", "Kubernetes quick start", "A fleet, with Helm"}, sections, "a README shell block that no test checks")
	require.Equal(t, []string{readmeQuickStart, readmeMakeTest}, blocks["Quick start"])

	makefile, err := os.ReadFile("../../Makefile")
	require.NoError(t, err)
	for _, target := range []string{"build", "test"} {
		require.Regexp(t, `(?m)^`+target+`:`, string(makefile), "make %s", target)
	}
}

// The README's summary, its text before the first section, names every
// command the binary has, each in backquotes, so a newcomer who reads
// only the top of the page knows all it does; a new command fails this
// until the summary says what it is for.
func TestReadmeSummaryNamesEveryCommand(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	summary, _, ok := strings.Cut(string(data), "\n## ")
	require.True(t, ok, "README.md has no section")
	var unnamed []string
	for _, c := range commands() {
		if !strings.Contains(summary, "`"+c.name+"`") {
			unnamed = append(unnamed, c.name)
		}
	}
	require.Empty(t, unnamed, "README.md's summary (before its first section) names no `%s`", strings.Join(unnamed, "`, `"))
}
