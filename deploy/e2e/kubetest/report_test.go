package kubetest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteObject writes a GET's body and a typed object as indented
// JSON, and reports a body that is not JSON.
func TestWriteObject(t *testing.T) {
	dir := t.TempDir()
	WriteObject(t, dir, "raw.json", []byte(`{"kind":"PodList","items":[]}`))
	WriteObject(t, dir, "typed.json", map[string]int{"gpus": 2})
	for file, want := range map[string]string{
		"raw.json":   "{\n  \"kind\": \"PodList\",\n  \"items\": []\n}\n",
		"typed.json": "{\n  \"gpus\": 2\n}\n",
	} {
		b, err := os.ReadFile(filepath.Join(dir, file))
		require.NoError(t, err, "%s", file)
		require.Equal(t, want, string(b), "%s", file)
	}
	r := &errorRecorder{TB: t}
	WriteObject(r, dir, "bad.json", []byte("not json"))
	require.Contains(t, r.errors, filepath.Join(dir, "bad.json"))
	require.NoFileExists(t, filepath.Join(dir, "bad.json"))
}

// errorRecorder records an error instead of failing the test.
type errorRecorder struct {
	testing.TB
	errors string
}

func (r *errorRecorder) Errorf(format string, args ...any) {
	r.errors += fmt.Sprintf(format, args...)
}
