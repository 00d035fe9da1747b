package resourceslices

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	resourcev1 "k8s.io/api/resource/v1"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// The real runs the plans are proven equal to (RecordedRuns): the DRA
// suite's ResourceSlices, one directory per profile (the suite's slug of
// its row), as the suite records them under make docs. The NVIDIA
// driver's: the gpu-kubelet-plugin of
// github.com/kubernetes-sigs/dra-driver-nvidia-gpu at 95932046 (its
// August 2026 head, v0.5.0-dev), with nvml-mock's NVML
// (github.com/NVIDIA/k8s-test-infra at 3b2b865d) reading the profile.
// dranet's: sigs.k8s.io/dranet at f258477 (v1.4.0-70), beside it on the
// profiles with HCAs. Each run's programs.txt names its binaries by
// sha256 and version; docs/evidence/resourceslices.md says how they were
// recorded.

// recordedNode is the node the suite runs the drivers on.
const recordedNode = "nvml-mock-node"

// plans are the plans proven, by driver.
func plans() map[string]Driver {
	out := map[string]Driver{}
	for _, d := range DefaultDrivers() {
		out[d.Name()] = d
	}
	return out
}

// explained are the differences between the recorded slices and the
// plans, by the path of the field (as flatten spells it), each with why
// it is not a difference of what the scheduler sees, or why the plan
// cannot know it. Every other difference fails the test, and so does an
// explanation that no longer matches one. docs/evidence/resourceslices.md
// lists the same.
var explained = []struct {
	path, why string
}{
	{`metadata\.ownerReferences.*`, "the driver makes the Node the owner, by the Node's UID, which only the API server knows: a publisher sets the owner"},
	{`spec\.devices\[pci-[0-9a-f-]+\]\.attributes\.dra\.net/numaNode\.int`, "dranet's own numaNode comes from ghw, which reads a function's NUMA node only on a host of more than one NUMA node (/sys/devices/system/node, the host's, not the tree's): the recording host has one, the profile's machine more"},
}

// TestRecordedRun compares, device by device and attribute by attribute,
// each driver's planned slices for each profile of its recorded run with
// the slices the real driver published for it.
func TestRecordedRun(t *testing.T) {
	used := map[string]bool{}
	for driver, dir := range RecordedRuns() {
		drv, ok := plans()[driver]
		if !ok {
			t.Fatalf("recorded run of %s, a driver this package does not plan", driver)
		}
		t.Run(driver, func(t *testing.T) {
			dirs, err := os.ReadDir(dir)
			if err != nil || len(dirs) == 0 {
				t.Fatalf("no recorded run in %s: %v", dir, err)
			}
			checkProvenance(t, driver, dir)
			for _, d := range dirs {
				if !d.IsDir() {
					continue
				}
				t.Run(d.Name(), func(t *testing.T) {
					p := suiteProfile(t, d.Name())
					ours, err := drv.Slices(p, recordedNode)
					if err != nil {
						t.Fatal(err)
					}
					recorded := readRecorded(t, filepath.Join(dir, d.Name(), "resourceslices.json"))
					if len(ours) != len(recorded) {
						t.Fatalf("%d slices, the driver published %d", len(ours), len(recorded))
					}
					for i := range ours {
						for _, diff := range compare(t, recorded[i], ours[i]) {
							why := explain(diff.path)
							if why == "" {
								t.Errorf("%s: the driver published %s, we plan %s", diff.path, diff.real, diff.ours)
								continue
							}
							used[why] = true
							t.Logf("explained: %s: the driver published %s, we plan %s", diff.path, diff.real, diff.ours)
						}
					}
				})
			}
		})
	}
	if t.Failed() {
		return
	}
	for _, e := range explained {
		if !used[e.why] {
			t.Errorf("explained difference %s (%s) occurs in no recorded slice: remove it", e.path, e.why)
		}
	}
}

// provenanceFile, beside each recorded run's profiles, names every
// program of the run by its file name, sha256 and version, one a line:
// NAME sha256:HEX version:VERSION, then what it is.
const provenanceFile = "programs.txt"

// provenanceLine is a line of provenanceFile that names a program.
var provenanceLine = regexp.MustCompile(`^(\S+) sha256:([0-9a-f]{64}) version:(\S+) `)

// checkProvenance: a recorded run says which binaries made it, the
// driver's own among them, each by digest and version.
func checkProvenance(t *testing.T, driver, dir string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, provenanceFile))
	if err != nil {
		t.Fatalf("recorded run %s names no binaries: %v", dir, err)
	}
	named := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		if m := provenanceLine.FindStringSubmatch(line); m != nil {
			named[m[1]] = true
		}
	}
	// The NVIDIA driver's run is also nvml-mock's NVML's, which it reads.
	want := map[string][]string{
		NVIDIAGPUDriver: {"gpu-kubelet-plugin", "libnvidia-ml.so.1"},
		DRANetDriver:    {"dranet"},
	}[driver]
	for _, p := range want {
		if !named[p] {
			t.Errorf("%s/%s: no line \"%s sha256:HEX version:VERSION ...\"", dir, provenanceFile, p)
		}
	}
}

type difference struct{ path, real, ours string }

// compare lists the fields where two slices differ, every field of
// either: devices (and any list of named objects) are matched by name, so
// the driver's order (a Go map's) is not a difference.
func compare(t *testing.T, real, ours resourcev1.ResourceSlice) []difference {
	t.Helper()
	r, o := flatten(t, real), flatten(t, ours)
	var out []difference
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		seen := map[string]bool{}
		for _, m := range []map[string]string{r, o} {
			for k := range m {
				if !seen[k] {
					seen[k] = true
					if !yield(k) {
						return
					}
				}
			}
		}
	}) {
		if r[k] != o[k] {
			out = append(out, difference{k, orAbsent(r[k]), orAbsent(o[k])})
		}
	}
	return out
}

func orAbsent(s string) string { return cmpOr(s, "nothing") }

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// flatten spells every leaf of v's JSON as path -> value.
func flatten(t *testing.T, v any) map[string]string {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				walk(strings.TrimPrefix(path+"."+k, "."), e)
			}
		case []any:
			for i, e := range v {
				key := fmt.Sprint(i)
				if m, ok := e.(map[string]any); ok {
					if name, ok := m["name"].(string); ok {
						key = name
					}
				}
				walk(fmt.Sprintf("%s[%s]", path, key), e)
			}
		default:
			b, _ := json.Marshal(v)
			out[path] = string(b)
		}
	}
	walk("", doc)
	return out
}

func explain(path string) string {
	for _, e := range explained {
		if regexp.MustCompile(`^(` + e.path + `)$`).MatchString(path) {
			return e.why
		}
	}
	return ""
}

func readRecorded(t *testing.T, file string) []resourcev1.ResourceSlice {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var list resourcev1.ResourceSliceList
	if err := json.Unmarshal(data, &list); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	for i := range list.Items {
		// The list's items carry no kind: the list says it.
		list.Items[i].TypeMeta.APIVersion, list.Items[i].TypeMeta.Kind = list.APIVersion, "ResourceSlice"
	}
	return list.Items
}

// suiteProfile is the profile of a row of the DRA suite, by its slug:
// built-in NAME, shared NAME (../shared's nvml-mock profiles), or a
// repository profile; as ReadProfile reads it and Parse parses it, the
// command's way.
func suiteProfile(t *testing.T, slug string) *Profile {
	t.Helper()
	var nameOrPath string
	switch {
	case strings.HasPrefix(slug, "built-in-"):
		nameOrPath = strings.TrimPrefix(slug, "built-in-")
	case strings.HasPrefix(slug, "shared-"):
		nameOrPath = filepath.Join(overlaytest.SharedTestdata(t, "nvml-mock-profiles"), strings.TrimPrefix(slug, "shared-")+".yaml")
	default:
		for _, dir := range []string{"testdata/suite-profiles", "testdata/profiles"} {
			f := filepath.Join(overlaytest.Repo(t), dir, slug+".yaml")
			if _, err := os.Stat(f); err == nil {
				nameOrPath = f
			}
		}
	}
	if nameOrPath == "" {
		t.Fatalf("no profile for the recorded row %s", slug)
	}
	source, data, err := ReadProfile(nameOrPath)
	if err != nil {
		t.Fatal(err)
	}
	p, err := Parse(source, data)
	if err != nil {
		t.Fatal(err)
	}
	return p
}
