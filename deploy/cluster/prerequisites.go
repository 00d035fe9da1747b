package cluster

import (
	"fmt"
	"os"
	"testing"
)

// Prerequisites is t for the checks of what a Kubernetes suite needs to
// run at all (root, runc, nsenter, the CNI plugins): they skip the test
// when it cannot run, except under make e2e-k8s (MatrixEnv set), where a
// skip fails it instead. make runs these suites with plain go test, not
// through gotestsum's summary, and a skipped package passes there
// silently: make test would be green with no cluster ever started. Start
// uses it; a suite passes its own checks through it too.
func Prerequisites(t testing.TB) testing.TB {
	if os.Getenv(MatrixEnv) == "" {
		return t
	}
	return noSkip{t}
}

// noSkip turns a skip into a failure that says why.
type noSkip struct{ testing.TB }

func (n noSkip) refuse(why string) {
	n.Helper()
	n.Fatalf("%s is set (make e2e-k8s), so this cannot be skipped: %s", MatrixEnv, why)
}

func (n noSkip) Skip(args ...any) { n.Helper(); n.refuse(fmt.Sprint(args...)) }

func (n noSkip) Skipf(format string, args ...any) { n.Helper(); n.refuse(fmt.Sprintf(format, args...)) }

func (n noSkip) SkipNow() { n.Helper(); n.refuse("SkipNow") }
