package writer

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func withEntries(p *plan.Plan, extra ...plan.Entry) *plan.Plan {
	q := *p
	q.Entries = append(slices.Clone(p.Entries), extra...)
	return &q
}

// TestKilledKindChangeRecovers leaves what a render killed right after
// turning a file into a directory leaves: the union manifest, no marker,
// the directory. The next render must own both kinds and put the file back,
// not refuse the directory as foreign.
func TestKilledKindChangeRecovers(t *testing.T) {
	t.Parallel()
	base := replayPlans(t)[0]
	a := withEntries(base, plan.Entry{Path: "extra", Kind: plan.File, Mode: 0o644, Data: []byte("a\n")})
	b := withEntries(base,
		plan.Entry{Path: "extra", Kind: plan.Dir, Mode: 0o755},
		plan.Entry{Path: "extra/x", Kind: plan.File, Mode: 0o644, Data: []byte("b\n")})
	root := filepath.Join(t.TempDir(), "root")
	_, err := Apply(root, a, Options{SkipSync: true})
	require.NoError(t, err)

	owned, err := parseManifest(manifestOf(a.Entries))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(root, ManifestFile), union(owned, b.Entries), 0o644))
	require.NoError(t, os.Remove(filepath.Join(root, MarkerFile)))
	require.NoError(t, os.Remove(filepath.Join(root, "extra")))
	require.NoError(t, os.Mkdir(filepath.Join(root, "extra"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "extra/x"), []byte("b\n"), 0o644))

	_, err = Apply(root, a, Options{SkipSync: true})
	require.NoError(t, err)
	data, err := os.ReadFile(filepath.Join(root, "extra"))
	require.NoError(t, err)
	require.Equal(t, "a\n", string(data))
	got, err := os.ReadFile(filepath.Join(root, ManifestFile))
	require.NoError(t, err)
	require.Equal(t, string(manifestOf(a.Entries)), string(got))
}

// TestParseManifest covers what a manifest may hold after a killed render.
func TestParseManifest(t *testing.T) {
	t.Parallel()
	owned, err := parseManifest([]byte("d sys\nf x\nl y\nd x\nf sys/a\n"))
	require.NoError(t, err)
	require.Len(t, owned, 4)
	require.Equal(t, plan.File, owned["x"].kind)
	require.True(t, owned["x"].has(plan.Dir))
	require.True(t, owned["x"].has(plan.File))
	require.False(t, owned["x"].has(plan.Symlink))
	require.Equal(t, []int{0, 1, 2, 3}, []int{owned["sys"].pos, owned["x"].pos, owned["y"].pos, owned["sys/a"].pos})
	// union keeps both kinds and must not trip over the duplicate.
	again, err := parseManifest(union(owned, []plan.Entry{{Path: "z", Kind: plan.File}}))
	require.NoError(t, err)
	require.Equal(t, owned["x"].kinds, again["x"].kinds)
	require.Contains(t, again, "z")
}
