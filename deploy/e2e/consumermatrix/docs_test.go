package consumermatrix_test

import (
	"os"
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/overlaytest/docmatrix"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
)

// consumersPage is the docs page that holds the consumer matrix: the
// README links it and shows only a summary.
func consumersPage() docmatrix.Page {
	return docmatrix.Page{Path: "../../../docs/evidence/consumers.md", Suite: "deploy/e2e/consumermatrix TestConsumers (make e2e)", Keys: 2}
}

// syncDocs checks the committed matrix against this run's table, or
// rewrites it (make docs). A run that adds profiles or sabotages the tree
// rows has another table on purpose, and a failed run has said why
// already: neither is compared.
func (s *suite) syncDocs(t *testing.T, table string) {
	t.Helper()
	switch {
	case s.sabotage != "", os.Getenv(programs.ExtraProfilesEnv) != "":
		t.Logf("this run's matrix is not the committed one (%s or %s set): docs/evidence/consumers.md not compared", programs.SabotageEnv, programs.ExtraProfilesEnv)
	case t.Failed():
	default:
		consumersPage().Sync(t, table, os.Getenv("NVML_MOCK_SYSFS_MATRIX"))
	}
}
