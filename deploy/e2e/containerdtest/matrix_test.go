package containerdtest_test

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// runtimePage is the docs page that holds TestContainerd's matrix: one row
// per way a node hands the device to a pod.
func runtimePage() docmatrix.Page {
	return docmatrix.Page{Path: "../../../docs/evidence/runtime.md", Suite: "deploy/e2e/containerdtest TestContainerd", Keys: 2}
}

// matrixEnv names a file the suite also writes its matrix to (make docs
// and make test print it).
const matrixEnv = "NVML_MOCK_SYSFS_RUNTIME_MATRIX"

// routes collects TestContainerd's rows: how a pod is served, what it
// asks, and what it must get, with the verdict of the subtest that checked
// it.
type routes struct{ docmatrix.Rows }

// expect makes the subtest t the row route / asks: ✓ want when it passes,
// ✗ when it fails, – when it is skipped, known as it ends.
func (r *routes) expect(t *testing.T, route, asks, want string) { r.Expect(t, route, asks, want) }

// expectWith is expect for a row whose program may not be supplied: where
// it is not, the row says so and expectWith returns false (the subtest
// returns).
func (r *routes) expectWith(t *testing.T, supplied bool, program, route, asks, want string) bool {
	t.Helper()
	r.Expect(t, route, asks, want)
	if !supplied {
		r.NotRun(t, programs.NotRun(t.Name(), program))
	}
	return supplied
}

// table is the matrix as Markdown.
func (r *routes) table() string { return r.Table("route", "the pod asks with", "it gets") }

// writeDocs writes the matrix where matrixEnv says, and checks it against
// docs/evidence/runtime.md (writeMatrix).
func (r *routes) writeDocs(t *testing.T) {
	t.Helper()
	writeMatrix(t, runtimePage(), matrixEnv, r.table())
}

// writeMatrix writes a suite's table to the file env names (make and the
// sabotage suite read it there), and checks it against page (or rewrites
// it, make docs) after a green run (docmatrix.Page.Sync leaves out a run
// of some subtests only, or a sabotaged one): a failed one has said why
// already.
func writeMatrix(t *testing.T, page docmatrix.Page, env, table string) {
	t.Helper()
	if file := os.Getenv(env); file != "" {
		if err := os.WriteFile(file, []byte(table), 0o644); err != nil {
			t.Errorf("%s: %v", env, err)
		}
	}
	if !t.Failed() {
		page.Sync(t, table, os.Getenv(env))
	}
}
