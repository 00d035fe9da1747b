package programs

import (
	"os"
	"strings"
	"testing"
)

// HostPCIIDs is Debian's pci.ids (pciutils pulls it in), which go-nvlib
// and the kubevirt plugin read names from.
const HostPCIIDs = "/usr/share/misc/pci.ids"

// H100SXM5PCIIDs is the line HostPCIIDs has for 10de:2330, the H100 SXM5
// of testdata/profiles/vfio-passthrough.yaml, whose name the suites expect
// in the labels and resources named from it.
const H100SXM5PCIIDs = "\t2330  GH100[H100 SXM5 80GB]"

// RequirePCIIDsLine fails t unless HostPCIIDs holds line whole: a check
// that expects a name from pci.ids says first that this copy gives it.
func RequirePCIIDsLine(t testing.TB, line string) {
	t.Helper()
	ids, err := os.ReadFile(HostPCIIDs)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(ids), "\n"+line+"\n") {
		t.Fatalf("%s has no line %q, which this check's expected name is written from", HostPCIIDs, line)
	}
}
