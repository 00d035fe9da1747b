package consumers_test

import (
	"testing"

	"github.com/nvml-mock/nvml-mock-sysfs/compat/consumers"
)

// suiteProfile is one profile of the suite (consumers.SuiteProfile, the
// one profile set of every end-to-end suite).
type suiteProfile = consumers.SuiteProfile

// suiteProfiles is consumers.SuiteProfiles.
func suiteProfiles(t *testing.T) []suiteProfile {
	t.Helper()
	return consumers.SuiteProfiles(t)
}
