package profile_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
)

// maxFuzzPlanDevices keeps each fuzz iteration quick: larger machines are
// parsed and normalised, but not planned.
const maxFuzzPlanDevices = 64

// requireProfileError checks what every refusal must be: a *profile.Error
// whose message is one non-empty line naming the source.
func requireProfileError(t *testing.T, err error, source string) {
	t.Helper()
	var pe *profile.Error
	require.True(t, errors.As(err, &pe), "not a *profile.Error: %T %v", err, err)
	msg := err.Error()
	require.True(t, strings.HasPrefix(msg, "profile "+source), msg)
	require.NotContains(t, msg, "\n")
	require.Greater(t, len(msg), len("profile "+source+": "))
}

// FuzzParse feeds arbitrary bytes through Parse, Normalize and plan.New:
// nothing may panic, every refusal is a one-line *profile.Error, and every
// accepted profile plans into a tree that keeps the plan's invariants.
// Seeds: the built-ins as effective profiles, testdata/flip, every hostile
// profile of testdata/hostile, and testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	for _, b := range shipped.All() {
		m, err := profile.Normalize(b.Name, b.New(), profile.Options{})
		require.NoError(f, err)
		data, err := profile.Marshal(m.Effective(), "seed")
		require.NoError(f, err)
		f.Add(data)
	}
	for _, glob := range []string{"../../testdata/hostile/*.yaml", "../../testdata/flip/*.yaml"} {
		files, err := filepath.Glob(glob)
		require.NoError(f, err)
		require.NotEmpty(f, files, glob)
		for _, file := range files {
			data, err := os.ReadFile(file)
			require.NoError(f, err)
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const source = "fuzz.yaml"
		p, err := profile.Parse(source, data)
		if err != nil {
			requireProfileError(t, err, source)
			return
		}
		m, err := profile.Normalize(source, p, profile.Options{})
		if err != nil {
			requireProfileError(t, err, source)
			return
		}
		if len(m.Devices) > maxFuzzPlanDevices {
			return
		}
		require.Empty(t, plancheck.CheckMachine(m))
	})
}
