package consumermatrix_test

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/docmatrix"
)

// consumersPage is the docs page that holds the consumer matrix: the
// README links it and shows only a summary.
func consumersPage() docmatrix.Page {
	return docmatrix.Page{Path: "../../../docs/evidence/consumers.md", Suite: "deploy/e2e/consumermatrix TestConsumers (make e2e)", Keys: 2}
}

// syncDocs checks the committed matrix against this run's table, or
// rewrites it (make docs), after a green run: a failed run has said why
// already.
func (s *suite) syncDocs(t *testing.T, table string) {
	t.Helper()
	if !t.Failed() {
		consumersPage().Sync(t, table, os.Getenv("NVML_MOCK_SYSFS_MATRIX"))
	}
}
