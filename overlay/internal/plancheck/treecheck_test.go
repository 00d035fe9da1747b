package plancheck

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
)

func dir(p string) plan.Entry  { return plan.Entry{Path: p, Kind: plan.Dir} }
func file(p string) plan.Entry { return plan.Entry{Path: p, Kind: plan.File} }
func link(p, target string) plan.Entry {
	return plan.Entry{Path: p, Kind: plan.Symlink, Target: target}
}
func tree(entries ...plan.Entry) Tree { return FromEntries(entries) }
func overlayBase() []plan.Entry {
	return []plan.Entry{
		dir("opt"), link("opt/nvml-mock", ".."),
		dir("sys"), dir("sys/bus"), dir("sys/bus/pci"), dir(plan.LinksDir),
		dir("sys/devices"), dir("sys/devices/pci0000:00"),
		dir("sys/devices/pci0000:00/0000:00:01.0"),
		dir("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
		file("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/vendor"),
		dir("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"),
		file("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0/vendor"),
		link(plan.LinksDir+"/0000:01:00.0", "../../../../opt/nvml-mock/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
		link(plan.LinksDir+"/0000:02:00.0", "0000:01:00.0/../../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"),
	}
}

func TestResolve(t *testing.T) {
	gpu := "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"
	cases := []struct {
		name    string
		extra   []plan.Entry
		path    string
		want    string
		escape  bool
		failure string
	}{
		{name: "bridge entry escapes to the container root and back", path: plan.LinksDir + "/0000:01:00.0", want: "sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"},
		{name: "endpoint entry goes through its anchor", path: plan.LinksDir + "/0000:02:00.0/vendor", want: gpu + "/vendor"},
		{name: "absolute link escapes", extra: []plan.Entry{link("sys/x", "/etc")}, path: "sys/x", escape: true},
		{name: "climbing above the root escapes", extra: []plan.Entry{link("sys/x", "../../..")}, path: "sys/x", escape: true},
		{name: "dangling link", extra: []plan.Entry{link("sys/x", "devices/pci0000:99")}, path: "sys/x", failure: "file does not exist"},
		{name: "file as a directory", path: gpu + "/vendor/x", failure: "is a file, not a directory"},
		{name: "loop", extra: []plan.Entry{link("sys/a", "b"), link("sys/b", "a")}, path: "sys/a", failure: "more than 40 links"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tree(append(overlayBase(), tc.extra...)...).Resolve(tc.path)
			switch {
			case tc.escape:
				require.True(t, IsEscape(err), "want an escape, got %v", err)
			case tc.failure != "":
				require.ErrorContains(t, err, tc.failure)
			default:
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
			}
		})
	}
}

func TestCheckLinksDir(t *testing.T) {
	cases := []struct {
		name  string
		extra []plan.Entry
		bad   string
	}{
		{name: "good tree"},
		{name: "anchor is not four levels below sys", extra: []plan.Entry{
			link(plan.LinksDir+"/0000:02:00.0", "0000:00:01.0/../../../../devices/pci0000:00/0000:00:01.0/0000:01:00.0/0000:02:00.0"),
		}, bad: "0000:02:00.0"},
		{name: "resolves to another device", extra: []plan.Entry{
			link(plan.LinksDir+"/0000:03:00.0", "../../../../opt/nvml-mock/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
		}, bad: "another device"},
		{name: "upper-case name", extra: []plan.Entry{
			link(plan.LinksDir+"/0000:0A:00.0", "../../../../opt/nvml-mock/sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0"),
		}, bad: "not a lower-case BDF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := tree(append(overlayBase(), tc.extra...)...).CheckLinksDir()
			if tc.bad == "" {
				require.Empty(t, bad)
				return
			}
			require.Len(t, bad, 1)
			require.Contains(t, bad[0], tc.bad)
		})
	}
}
