package fleet_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/podtest"
)

const mapFile = "/etc/nvml-mock-sysfs/fleet/fleet.yaml"

// exampleMap is the package comment's example, as the Helm chart writes it.
const exampleMap = `# The first rule that matches wins: the node's name, then the label rules in order, then default.
nodes:                 # node name -> profile
  worker-a: dgx-a100
labels:                # then the first rule all of whose labels the node has
  - match:
      nvml-mock/profile: gb200
    profile: gb200.yaml
default: dgx-a100      # optional; without it an unmatched node is not served
`

// requireRefusal checks what every refusal must be: one line, naming the
// map's file and each of want.
func requireRefusal(t *testing.T, err error, file string, want ...string) {
	t.Helper()
	require.Error(t, err)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, "fleet map "+file+": "), msg)
	require.NotContains(t, msg, "\n")
	for _, w := range want {
		require.Contains(t, msg, w)
	}
}

func TestParseRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		want []string
	}{
		{"empty file", "", []string{"empty: want nodes, labels or default"}},
		{"only a comment", "# nothing yet\n", []string{"empty"}},
		{"null", "null\n", []string{"no nodes, no labels and no default"}},
		{"empty mapping", "{}\n", []string{"no nodes, no labels and no default"}},
		{"empty parts", "nodes: {}\nlabels: []\ndefault: \"\"\n", []string{"no nodes, no labels and no default"}},
		{"unknown top-level field", "nodes: {a: dgx-a100}\nnodez: {}\n", []string{`unknown field "nodez"`, "line 2", "nodes, labels and default"}},
		{"default misspelt", "defualt: dgx-a100\n", []string{`unknown field "defualt"`}},
		{"unknown rule field", "labels:\n  - match: {a: b}\n    profle: x\n", []string{`unknown field "profle" in a label rule`, "line 3"}},
		{"empty node profile", "nodes:\n  worker-a:\n", []string{"nodes.worker-a: empty profile"}},
		{"empty quoted node profile", "nodes:\n  worker-a: \"\"\n", []string{"nodes.worker-a: empty profile"}},
		{"empty node name", "nodes:\n  \"\": dgx-a100\n", []string{"nodes: empty node name"}},
		{"empty rule profile", "labels:\n  - match: {a: b}\n  - match: {c: d}\n    profile: \"\"\n", []string{"labels[0].profile: empty profile"}},
		{"second rule's empty profile", "labels:\n  - match: {a: b}\n    profile: x.yaml\n  - match: {c: d}\n", []string{"labels[1].profile: empty profile"}},
		{"rule without match", "labels:\n  - profile: gb200.yaml\n", []string{"labels[0].match: no labels to match"}},
		{"rule with empty match", "labels:\n  - match: {}\n    profile: gb200.yaml\n", []string{"labels[0].match: no labels to match"}},
		{"label key no node can carry", "labels:\n  - match: {\"bad key!\": x}\n    profile: p.yaml\n", []string{"labels[0].match", `"bad key!"`, "not a label key"}},
		{"label value no node can carry", "labels:\n  - match: {k: \"two words\"}\n    profile: p.yaml\n", []string{"labels[0].match.k", `"two words"`, "not a label value"}},
		{"nodes as a list", "nodes: [worker-a]\n", []string{"line 1", "cannot unmarshal !!seq into a mapping"}},
		{"labels as a mapping", "labels: {a: b}\n", []string{"into labels (a list of rules)"}},
		{"profile as a list", "nodes: {worker-a: [x]}\n", []string{"cannot unmarshal !!seq into string"}},
		{"top level a scalar", "dgx-a100\n", []string{"into a fleet map"}},
		{"duplicate node", "nodes:\n  a: dgx-a100\n  a: t4-vm\n", []string{`mapping key "a" already defined`}},
		{"two documents", "nodes: {a: dgx-a100}\n---\ndefault: t4-vm\n", []string{"more than one YAML document"}},
		{"not YAML", "nodes: {a: b\n", []string{"fleet map"}},
		{"too large", "default: dgx-a100\n" + strings.Repeat("#", fleet.MaxSize), []string{"larger than the 1 MiB limit"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m, err := fleet.Parse(mapFile, []byte(tc.text))
			require.Nil(t, m)
			requireRefusal(t, err, mapFile, tc.want...)
			var fe *fleet.Error
			require.ErrorAs(t, err, &fe)
		})
	}
}

func TestParseExample(t *testing.T) {
	t.Parallel()
	m, err := fleet.Parse(mapFile, []byte(exampleMap))
	require.NoError(t, err)
	require.Equal(t, &fleet.Map{
		File:    mapFile,
		Nodes:   map[string]string{"worker-a": "dgx-a100"},
		Labels:  []fleet.LabelRule{{Match: map[string]string{"nvml-mock/profile": "gb200"}, Profile: "gb200.yaml"}},
		Default: "dgx-a100",
	}, m)
	require.True(t, m.NeedsLabels())

	for _, text := range []string{"default: t4-vm\n", "nodes: {worker-a: t4-vm}\n"} {
		m, err := fleet.Parse(mapFile, []byte(text))
		require.NoError(t, err, text)
		require.False(t, m.NeedsLabels(), "%s: no label rules, no API server", text)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "fleet.yaml")
	require.NoError(t, os.WriteFile(file, []byte(exampleMap), 0o644))
	m, err := fleet.Load(file)
	require.NoError(t, err)
	require.Equal(t, file, m.File)
	require.Equal(t, "dgx-a100", m.Default)

	missing := filepath.Join(dir, "missing.yaml")
	_, err = fleet.Load(missing)
	requireRefusal(t, err, missing, "no such file")
	require.ErrorIs(t, err, os.ErrNotExist)

	_, err = fleet.Load(dir)
	requireRefusal(t, err, dir, "not a regular file")

	// A FIFO must not hang the sync that reads it.
	fifo := filepath.Join(dir, "fifo.yaml")
	require.NoError(t, syscall.Mkfifo(fifo, 0o644))
	_, err = fleet.Load(fifo)
	requireRefusal(t, err, fifo, "not a regular file")

	bad := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(bad, []byte("nodes:\n  worker-a:\n"), 0o644))
	_, err = fleet.Load(bad)
	requireRefusal(t, err, bad, "nodes.worker-a: empty profile")
}

func TestResolve(t *testing.T) {
	t.Parallel()
	const text = `nodes:
  worker-a: dgx-a100
  worker-b: b.yaml
labels:
  - match:
      nvml-mock/profile: gb200
    profile: gb200.yaml
  - match:
      nvml-mock/profile: gb200
      zone: east
    profile: never-reached.yaml
  - match:
      zone: east
      rack: "7"
    profile: /abs/east.yaml
default: t4-vm
`
	m, err := fleet.Parse(mapFile, []byte(text))
	require.NoError(t, err)
	dir := filepath.Dir(mapFile)
	tests := []struct {
		name   string
		node   string
		labels map[string]string
		want   fleet.Choice
	}{
		{"by name, a built-in", "worker-a", nil, fleet.Choice{Profile: "dgx-a100", Builtin: true, Rule: "nodes[worker-a]"}},
		{"name beats labels", "worker-a", map[string]string{"nvml-mock/profile": "gb200"}, fleet.Choice{Profile: "dgx-a100", Builtin: true, Rule: "nodes[worker-a]"}},
		{"by name, a file", "worker-b", nil, fleet.Choice{Profile: filepath.Join(dir, "b.yaml"), Rule: "nodes[worker-b]"}},
		{"by label", "worker-c", map[string]string{"nvml-mock/profile": "gb200", "other": "x"}, fleet.Choice{Profile: filepath.Join(dir, "gb200.yaml"), Rule: "labels[0] {nvml-mock/profile=gb200}"}},
		{"first matching rule wins", "worker-c", map[string]string{"nvml-mock/profile": "gb200", "zone": "east", "rack": "7"}, fleet.Choice{Profile: filepath.Join(dir, "gb200.yaml"), Rule: "labels[0] {nvml-mock/profile=gb200}"}},
		{"every label of a rule", "worker-c", map[string]string{"zone": "east", "rack": "7"}, fleet.Choice{Profile: "/abs/east.yaml", Rule: "labels[2] {rack=7,zone=east}"}},
		{"one label of two is no match", "worker-c", map[string]string{"zone": "east"}, fleet.Choice{Profile: "t4-vm", Builtin: true, Rule: "default"}},
		{"a value must be equal", "worker-c", map[string]string{"nvml-mock/profile": "gb300"}, fleet.Choice{Profile: "t4-vm", Builtin: true, Rule: "default"}},
		{"an empty value is not a missing label", "worker-c", map[string]string{"zone": "east", "rack": ""}, fleet.Choice{Profile: "t4-vm", Builtin: true, Rule: "default"}},
		{"no labels at all", "worker-c", nil, fleet.Choice{Profile: "t4-vm", Builtin: true, Rule: "default"}},
	}
	for _, tc := range tests {
		got, err := m.Resolve(tc.node, tc.labels)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}

	_, err = m.Resolve("", nil)
	requireRefusal(t, err, mapFile, "no node name")
}

func TestResolveNoMatch(t *testing.T) {
	t.Parallel()
	m, err := fleet.Parse(mapFile, []byte("nodes:\n  worker-a: dgx-a100\nlabels:\n  - match: {nvml-mock/profile: gb200}\n    profile: gb200.yaml\n"))
	require.NoError(t, err)
	_, err = m.Resolve("worker-c", map[string]string{"nvml-mock/profile": "h100"})
	var nm *fleet.NoMatchError
	require.ErrorAs(t, err, &nm)
	require.Equal(t, "fleet map /etc/nvml-mock-sysfs/fleet/fleet.yaml: node worker-c matches no rule and the map has no default", err.Error())
	require.Equal(t, &fleet.NoMatchError{File: mapFile, Node: "worker-c"}, nm)
}

// A profile value is a built-in only when shipped.Load would read it as
// one; anything else is a file beside the map.
func TestResolveProfileValues(t *testing.T) {
	t.Parallel()
	abs, err := filepath.Abs("rel/dir")
	require.NoError(t, err)
	tests := []struct {
		file, value string
		want        fleet.Choice
	}{
		{mapFile, "hgx-h100", fleet.Choice{Profile: "hgx-h100", Builtin: true, Rule: "default"}},
		{mapFile, "hgx-h100.yaml", fleet.Choice{Profile: "/etc/nvml-mock-sysfs/fleet/hgx-h100.yaml", Rule: "default"}},
		{mapFile, "./hgx-h100", fleet.Choice{Profile: "/etc/nvml-mock-sysfs/fleet/hgx-h100", Rule: "default"}},
		// nvml-mock's own name, not a built-in: a key of the map's ConfigMap.
		{mapFile, "h100", fleet.Choice{Profile: "/etc/nvml-mock-sysfs/fleet/h100", Rule: "default"}},
		{mapFile, "profiles/gb200.yaml", fleet.Choice{Profile: "/etc/nvml-mock-sysfs/fleet/profiles/gb200.yaml", Rule: "default"}},
		{mapFile, "../../nvml-mock/gb200/config.yaml", fleet.Choice{Profile: "/etc/nvml-mock/gb200/config.yaml", Rule: "default"}},
		{mapFile, "/etc/nvml-mock/gb200//config.yaml", fleet.Choice{Profile: "/etc/nvml-mock/gb200/config.yaml", Rule: "default"}},
		// A map named relative to the working directory gives absolute files.
		{"rel/dir/fleet.yaml", "gb200.yaml", fleet.Choice{Profile: filepath.Join(abs, "gb200.yaml"), Rule: "default"}},
	}
	for _, tc := range tests {
		m, err := fleet.Parse(tc.file, []byte("default: "+tc.value+"\n"))
		require.NoError(t, err, tc.value)
		got, err := m.Resolve("worker-a", nil)
		require.NoError(t, err, tc.value)
		require.Equal(t, tc.want, got, "%s in %s", tc.value, tc.file)
	}
}

// A ConfigMap volume holds each key as a symlink through ..data into a
// timestamped directory that the next update removes: a profile beside
// the map resolves through the volume's own directory, so it still reads
// after the update, and reads the new text.
func TestResolveThroughAConfigMapVolume(t *testing.T) {
	t.Parallel()
	cm := podtest.NewConfigMap(t, filepath.Join(t.TempDir(), "fleet"), "fleet.yaml", []byte(exampleMap))
	// The second key of the same ConfigMap: a symlink through ..data, as
	// the kubelet makes for each key.
	addKey := func(text string) {
		require.NoError(t, os.WriteFile(filepath.Join(cm.Dir, "..data", "gb200.yaml"), []byte(text), 0o644))
	}
	addKey("first")
	require.NoError(t, os.Symlink(filepath.Join("..data", "gb200.yaml"), filepath.Join(cm.Dir, "gb200.yaml")))

	m, err := fleet.Load(cm.File())
	require.NoError(t, err)
	got, err := m.Resolve("worker-c", map[string]string{"nvml-mock/profile": "gb200"})
	require.NoError(t, err)
	require.Equal(t, filepath.Join(cm.Dir, "gb200.yaml"), got.Profile, "through the volume, not the timestamped directory")
	data, err := os.ReadFile(got.Profile)
	require.NoError(t, err)
	require.Equal(t, "first", string(data))

	// Negative control: the map's symlink resolved names the timestamped
	// directory, which the update removes.
	resolved, err := filepath.EvalSymlinks(cm.File())
	require.NoError(t, err)
	stale := filepath.Join(filepath.Dir(resolved), "gb200.yaml")
	require.NotEqual(t, got.Profile, stale)

	cm.Swap([]byte(exampleMap))
	addKey("second")
	_, err = os.Stat(stale)
	require.ErrorIs(t, err, os.ErrNotExist, "the old timestamped directory is gone")
	m, err = fleet.Load(cm.File())
	require.NoError(t, err)
	again, err := m.Resolve("worker-c", map[string]string{"nvml-mock/profile": "gb200"})
	require.NoError(t, err)
	require.Equal(t, got, again)
	data, err = os.ReadFile(again.Profile)
	require.NoError(t, err)
	require.Equal(t, "second", string(data))
}

// FuzzParse feeds arbitrary bytes through Parse and Resolve: nothing may
// panic, every refusal is a one-line *fleet.Error naming the file, and an
// accepted map resolves every node to a profile and a rule, or to a
// *fleet.NoMatchError when it has no default.
func FuzzParse(f *testing.F) {
	for _, seed := range []string{
		exampleMap,
		"default: dgx-a100\n",
		"nodes:\n  worker-a: /etc/nvml-mock/a100/config.yaml\n  worker-b: ../b/config.yaml\n",
		"labels:\n  - match: {nvml-mock/profile: gb200, zone: east}\n    profile: gb200.yaml\n  - match: {a: \"\"}\n    profile: t4-vm\n",
		"nodes: {worker-a: }\n",
		"labels:\n  - profle: x\n",
		"nodes: &n {a: b}\nlabels: [{match: *n, profile: p}]\n",
		"x: &a [*a]\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const file = "/fuzz/fleet.yaml"
		m, err := fleet.Parse(file, data)
		if err != nil {
			var fe *fleet.Error
			require.True(t, errors.As(err, &fe), "not a *fleet.Error: %T %v", err, err)
			requireRefusal(t, err, file)
			return
		}
		require.True(t, len(m.Nodes) > 0 || len(m.Labels) > 0 || m.Default != "", "an empty map was accepted")
		nodes := []string{"worker-a", "some-node"}
		for n := range m.Nodes {
			nodes = append(nodes, n)
		}
		var labels map[string]string
		if len(m.Labels) > 0 {
			labels = m.Labels[0].Match
		}
		for _, node := range nodes {
			c, err := m.Resolve(node, labels)
			if err != nil {
				var nm *fleet.NoMatchError
				require.True(t, errors.As(err, &nm), "%T %v", err, err)
				require.Empty(t, m.Default)
				require.NotContains(t, err.Error(), "\n")
				continue
			}
			require.NotEmpty(t, c.Profile)
			require.NotEmpty(t, c.Rule)
			require.True(t, c.Builtin || filepath.IsAbs(c.Profile), "%+v", c)
		}
	})
}
