package reliability

import (
	"bytes"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
)

// result is one run of the binary.
type result struct {
	code   int
	stdout string
	stderr string
}

func runBinary(t testing.TB, bin string, args ...string) result {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if err != nil {
		ee, ok := err.(*exec.ExitError)
		require.True(t, ok, "run %s %v: %v", bin, args, err)
		code = ee.ExitCode()
	}
	return result{code: code, stdout: stdout.String(), stderr: stderr.String()}
}

// render runs the binary's render and requires success.
func render(t testing.TB, bin, root, profile string, extra ...string) {
	t.Helper()
	args := append([]string{"render", "--root", root, "--profile", profile}, extra...)
	r := runBinary(t, bin, args...)
	require.Equal(t, 0, r.code, "render %s into %s: %s", profile, root, r.stderr)
}
