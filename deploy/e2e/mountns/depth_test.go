package mountns_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// TestLinksTargetDepthRule mounts the links directory at targets of
// several depths in a private mount namespace, with the overlay at
// /opt/nvml-mock, and reads every entry's vendor through its link. The
// targets CheckLinksTarget accepts must resolve; a deeper one must not.
func TestLinksTargetDepthRule(t *testing.T) {
	overlaytest.RequireRoot(t)
	root := filepath.Join(t.TempDir(), "overlay")
	_, _, err := overlay.Render(overlay.Options{Profile: "hgx-h100", Root: root, Writer: writer.Options{SkipSync: true}})
	require.NoError(t, err)

	targets := []string{"/srv/four/b/c", "/srv/five/b/c/d"}
	served := hosttest.Served{Root: root, LinksAt: targets}
	out := served.Run(t, "sh", "-c", `for t in "$@"; do
	n=0; ok=0
	for e in "$t"/*; do
		n=$((n+1))
		if cat "$e/vendor" >/dev/null 2>&1; then ok=$((ok+1)); fi
	done
	echo "$t $ok/$n"
done`, "sh", targets[0], targets[1])
	t.Logf("entries whose vendor reads through the links (resolved/total):\n%s", out)

	entries, err := os.ReadDir(filepath.Join(root, plan.LinksDir))
	require.NoError(t, err)
	for _, target := range targets {
		var resolved, total int
		for _, line := range strings.Split(out, "\n") {
			if _, err := fmt.Sscanf(line, target+" %d/%d", &resolved, &total); err == nil {
				break
			}
		}
		require.Equal(t, len(entries), total, "%s: %s", target, out)
		if cdispec.CheckLinksTarget(target) == nil {
			require.Equal(t, total, resolved, "%s is accepted, so every link must resolve there", target)
		} else {
			require.Less(t, resolved, total, "%s is refused, so links must break there", target)
		}
	}
	require.NoError(t, cdispec.CheckLinksTarget(targets[0]))
	require.Error(t, cdispec.CheckLinksTarget(targets[1]))
}
