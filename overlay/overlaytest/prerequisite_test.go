package overlaytest

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMissing: outside make a missing prerequisite skips; under make it
// fails, saying the same.
func TestMissing(t *testing.T) {
	run := func(t *testing.T) (skipped, failed string) {
		r := &recorder{TB: t}
		done := make(chan struct{})
		go func() {
			defer close(done)
			Missing(r, "%s is not installed", "runc")
		}()
		<-done
		return r.skipped, r.failed
	}
	t.Setenv(UnderMakeEnv, "")
	skipped, failed := run(t)
	require.Equal(t, "runc is not installed", skipped)
	require.Empty(t, failed)
	t.Setenv(UnderMakeEnv, "1")
	skipped, failed = run(t)
	require.Empty(t, skipped)
	require.Equal(t, UnderMakeEnv+" is set (a make target, which installs every prerequisite), so this cannot be skipped: runc is not installed", failed)
}

// recorder records a skip or a failure and ends its goroutine, as
// testing.T does.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Skip(args ...any) {
	r.skipped = fmt.Sprint(args...)
	runtime.Goexit()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Helper() {}
