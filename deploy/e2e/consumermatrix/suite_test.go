package consumermatrix_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/compat"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/cdispec"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/programs"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/boards"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// compatChild is the mode in which the test binary, re-executed inside a
// served namespace, runs compat at /sys instead of the tests.
const compatChild = "compat"

func TestMain(m *testing.M) {
	if hosttest.ChildMode() == compatChild {
		os.Exit(runCompat(os.Args[len(os.Args)-2], os.Args[len(os.Args)-1]))
	}
	os.Exit(hosttest.Alone(func() int { return overlaytest.KeepHostRoot(m.Run) }))
}

// runCompat runs compat with the consumers' defaults (/sys) for the
// effective profile file named, and its NVML pairing (compat.NVMLCheck,
// what verify and compat --sysfs add in a served container) for the
// profile nvml-mock's NVML serves, printing its report as JSON.
func runCompat(effective, nvmlProfile string) int {
	p, err := profile.LoadFile(effective)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	m, err := profile.Normalize(effective, p, profile.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	report := compat.Run(m, compat.KernelSysfs)
	report.Results = append(report.Results, compat.NVMLCheck(nvmlProfile, compat.KernelSysfs))
	if err := json.NewEncoder(os.Stdout).Encode(report); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// What a consumer is served, as the matrix's rows name it.
const (
	servedTree    = "tree"
	servedNone    = "no tree"
	servedEscaped = "escaped links"
	servedMerged  = "tree + host devices"
)

// nfdServed is how node-feature-discovery's DaemonSet sees a node: the
// node's /sys at /host-sys and the links directory over both PCI device
// directories.
func nfdServed(root string) hosttest.Served {
	s := hosttest.Served{Root: root, HostSysAt: []string{"/host-sys"}}
	if root != "" {
		s.LinksAt = []string{"/" + plan.LinksDir, programs.NFDHostPCIDevices}
	}
	return s
}

// suite holds the built programs and the node's own facts, shared by every
// profile.
type suite struct {
	gfd, nfd, ghw, nvmlList string
	// nvml is nvml-mock's NVML where it is supplied, else our stand-in:
	// the rows it serves say which.
	nvml       programs.NVML
	kubeconfig string
	// nfdWhitelist is the PCI classes of the node's own devices, 0200
	// (Ethernet) and 03 (display: the GPUs).
	nfdWhitelist []string
	// nodeNFDLabels are nfd-worker's labels of the node as it is, with
	// nfdWhitelist; nodeGHW is what ghw lists of it.
	nodeNFDLabels        map[string]string
	nodeNFDDefaultLabels map[string]string
	// nodeNFDVendorLabels are its labels of the node with the operators'
	// config (operatorNFD).
	nodeNFDVendorLabels map[string]string
	nodeGHW             []programs.GHWDevice
	matrix              *matrix
	// sabotage, when set, serves the tree rows something else, to see
	// their checks fail.
	sabotage string
}

// TestConsumers runs the real consumers, built from their own sources,
// against every suite profile rendered and served as a container sees it,
// and without it, and prints the matrix of what each program reported.
func TestConsumers(t *testing.T) {
	programs.SkipShort(t)
	overlaytest.RequireRoot(t)
	start := time.Now()
	s := &suite{
		gfd:      programs.NeedBinary(t, programs.GFD()),
		nfd:      programs.NeedBinary(t, programs.NFDWorker()),
		ghw:      programs.NeedBinary(t, programs.GHWList()),
		nvmlList: programs.NeedBinary(t, programs.NVMLList()),
		nvml:     programs.NeedNVML(t),
		matrix:   newMatrix(),
		sabotage: programs.Sabotage(t),
	}
	profiles := suiteProfiles(t)
	t.Logf("programs ready in %s", time.Since(start).Round(time.Millisecond))
	dir := t.TempDir()
	s.kubeconfig = filepath.Join(dir, "kubeconfig")
	require.NoError(t, programs.WriteKubeconfig(s.kubeconfig))
	s.readNode(t)

	t.Run("profiles", func(t *testing.T) {
		for _, p := range profiles {
			t.Run(p.Name, func(t *testing.T) {
				t.Parallel()
				s.profile(t, p)
			})
		}
	})
	var buf bytes.Buffer
	s.matrix.write(&buf, profiles)
	fmt.Fprintf(&buf, "\n%d profiles, %d program runs in %s\n", len(profiles), s.matrix.runs.Load(), time.Since(start).Round(time.Second))
	programs.WriteReport(t, "NVML_MOCK_SYSFS_MATRIX", buf.Bytes())
	s.syncDocs(t, buf.String())
}

// readNode learns the node's own devices and what nfd-worker and ghw say
// of the node without a tree: the baseline of the host-device checks.
func (s *suite) readNode(t *testing.T) {
	t.Helper()
	entries, err := os.ReadDir("/" + plan.LinksDir)
	require.NoError(t, err)
	require.NotEmpty(t, entries, "the node has no PCI device to keep")
	// 0207 (InfiniBand) names the HCAs of an infiniband block in that
	// link layer; in Ethernet mode they are 0200.
	classes := map[string]bool{"0200": true, "0207": true, "03": true}
	for _, e := range entries {
		class, err := os.ReadFile(filepath.Join("/", plan.LinksDir, e.Name(), "class"))
		require.NoError(t, err)
		classes[strings.TrimPrefix(strings.TrimSpace(string(class)), "0x")[:4]] = true
	}
	s.nfdWhitelist = slices.Sorted(maps.Keys(classes))
	s.nodeNFDDefaultLabels = s.runNFD(t, nfdServed(""), programs.NFDWorkerRun{})
	s.nodeNFDLabels = s.runNFD(t, nfdServed(""), programs.NFDWorkerRun{DeviceClassWhitelist: s.nfdWhitelist})
	s.nodeNFDVendorLabels = s.runNFD(t, nfdServed(""), operatorNFD())
	require.NotEmpty(t, s.nodeNFDLabels, "nfd-worker labels none of the node's own devices with the whitelist %v", s.nfdWhitelist)
	s.nodeGHW = s.runGHW(t, hosttest.Served{})
	require.Len(t, s.nodeGHW, len(entries), "ghw lists the node's own devices")
}

// subject is one profile, rendered.
type subject struct {
	suiteProfile
	// facts are the profile's, read apart from the renderer
	// (programs.SuiteProfile.Facts): every expectation below comes from
	// them, the render's plan gives only the bridges and HCAs.
	facts *profilefacts.Profile
	gpus  []profilefacts.GPU
	// nvml is the profile nvml-mock's NVML serves (programs.NVMLProfile):
	// the file itself, or on a passthrough node its nvidia-bound GPUs
	// alone; nvmlGPUs are those GPUs, the ones GFD's NVML strategy and the
	// DRA driver can see, and vfio counts the others.
	nvml     string
	nvmlGPUs []profilefacts.GPU
	vfio     int
	// bridges are the bridges the plan puts in the tree, rendered alone
	// and with the host's devices (which keep bridges off the host's BDFs).
	bridges, mergedBridges []string
	// hcas are the HCAs of the profile's infiniband block, as the plan
	// placed them beside their GPUs, rendered alone and with the host's
	// devices (which may move an HCA's own root port).
	hcas, mergedHCAs []plan.HCA
	// mode is the gpu.mode GFD must label the node with.
	mode string
	// roots: as rendered, with host devices, and with plain escaped links.
	root, merged, escaped string
}

func (s *suite) render(t *testing.T, p suiteProfile) *subject {
	t.Helper()
	x := &subject{suiteProfile: p, facts: p.Facts(t)}
	var err error
	x.gpus = x.facts.GPUs
	require.NotEmpty(t, x.gpus)
	x.nvml, err = programs.NVMLProfile(t.TempDir(), p.Name, p.File)
	require.NoError(t, err)
	x.nvmlGPUs = x.facts.NVIDIABound()
	x.vfio = len(x.gpus) - len(x.nvmlGPUs)
	dir := t.TempDir()
	x.root, x.merged = filepath.Join(dir, "tree"), filepath.Join(dir, "merged")
	pl, _, err := overlay.Render(overlay.Options{Profile: p.File, Root: x.root})
	require.NoError(t, err)
	x.hcas, x.bridges = pl.Tree.HCAs, bridgesOf(pl)
	merged, _, err := overlay.Render(overlay.Options{Profile: p.File, Root: x.merged, HostDevices: overlay.HostDevicesMerge})
	require.NoError(t, err)
	x.mergedHCAs, x.mergedBridges = merged.Tree.HCAs, bridgesOf(merged)
	x.escaped = hosttest.PlainLinksCopy(t, x.root)
	// GFD labels a node whose GPUs differ in class "unknown" (the suite's
	// own profiles each have one class; an extra profile may not).
	x.mode = "unknown"
	if classes := x.facts.Classes(); len(classes) == 1 {
		x.mode = gfdMode(classes[0])
	}
	return x
}

// gfdMode is the gpu.mode GFD v0.17.4 labels GPUs of a PCI class with
// (its resource/nvml-lib.go: a 3D controller computes, a VGA controller
// is graphics), written here apart from compat's GFDMode, which compat's
// own row applies.
func gfdMode(class uint32) string {
	switch class {
	case profilefacts.Class3D:
		return "compute"
	case profilefacts.ClassVGA:
		return "graphics"
	}
	return "unknown"
}

// besidesVFIO notes, where the profile binds GPUs to vfio-pci, that a
// count of NVML's GPUs leaves them out.
func (x *subject) besidesVFIO() string {
	if x.vfio == 0 {
		return ""
	}
	return fmt.Sprintf(" (NVML's; %d on %s)", x.vfio, profile.DriverVFIO)
}

// bridgesOf lists the BDFs of the bridges a plan puts in the tree.
func bridgesOf(pl *plan.Plan) []string {
	var out []string
	for _, n := range pl.Tree.Nodes() {
		if n.Role.IsBridge() {
			out = append(out, n.Address.String())
		}
	}
	return out
}

// products counts the distinct GPU products (device ids) of a profile.
func products(gpus []profilefacts.GPU) int {
	ids := map[uint16]bool{}
	for _, g := range gpus {
		ids[g.Product()] = true
	}
	return len(ids)
}

// profile runs every consumer for one profile, served every way.
func (s *suite) profile(t *testing.T, p suiteProfile) {
	x := s.render(t, p)
	tree := x.root
	switch s.sabotage {
	case programs.SabotageEscaped:
		tree = x.escaped
	case programs.SabotageNoTree:
		tree = ""
	}
	served := map[string]hosttest.Served{
		servedTree:    {Root: tree},
		servedNone:    {},
		servedEscaped: {Root: x.escaped},
	}
	row := func(name string) *row { return s.matrix.row(p.Name, name) }

	// GPU Feature Discovery: gpu.mode and gpu.count with the tree, the
	// same other labels as with escaped links (GFD v0.17.4 exits without a
	// tree: it reads each GPU's PCI vendor from sysfs). The tree run gets the variables of
	// the CDI spec the render is served with (GFD_MACHINE_TYPE_FILE, where
	// the render wrote a machine type), as a served pod does, and no flag;
	// the others get none (the escaped run serves the same file), so the
	// variable must change gpu.machine and nothing else.
	gfd, gfdFailed := map[string]map[string]string{}, map[string]string{}
	for _, name := range []string{servedTree, servedNone, servedEscaped} {
		sv := served[name]
		if name == servedTree {
			sv.Env = append(sv.Env, specEnv(t, x.root)...)
		}
		gfd[name], gfdFailed[name] = s.runGFD(t, sv, x.nvml, "")
	}
	gfdVFIO(t, x, s, served, row)
	gfdMachine(t, x, gfd, row)
	for _, name := range []string{servedTree, servedNone, servedEscaped} {
		labels, want := gfd[name], x.mode
		if name == servedNone {
			// Without the tree GFD must not label the GPUs' mode: v0.17.4
			// exits naming the first GPU sysfs lacks, later ones label
			// unknown.
			mode := labels[gfdModeLabel]
			text := "unknown"
			if failed := gfdFailed[name]; failed != "" {
				text = "exits: " + failed
			}
			row(name).check(t, colGFD, text+" ("+s.nvml.Name()+")", (gfdFailed[name] != "" && strings.Contains(gfdFailed[name], gfdNoVendor)) || mode == "unknown",
				fmt.Sprintf("want GFD to exit naming a GPU's vendor or label gpu.mode=unknown without the tree, got gpu.mode=%q, exit %q", mode, gfdFailed[name]))
			continue
		}
		if failed := gfdFailed[name]; failed != "" {
			row(name).check(t, colGFD, "exits: "+failed, false, "GFD failed: "+failed)
			continue
		}
		// GFD counts the GPUs NVML lists: on a passthrough node, the
		// nvidia-bound ones.
		mode, count := labels[gfdModeLabel], labels["nvidia.com/gpu.count"]
		text := fmt.Sprintf("%s, count %s%s (%s)", mode, count, x.besidesVFIO(), s.nvml.Name())
		ok := mode == want && count == strconv.Itoa(len(x.nvmlGPUs))
		why := fmt.Sprintf("want gpu.mode=%s and gpu.count=%d", want, len(x.nvmlGPUs))
		if products(x.nvmlGPUs) > 1 {
			// GFD labels a node as if all its GPUs were one product, taking
			// any one of them: count and product labels vary run to run.
			ok, why = mode == want, "want gpu.mode="+want
			row(name).check(t, colGFD, text+" (several products: count not compared)", ok, why)
			continue
		}
		if name == servedTree {
			if diff := labelDiff(gfd[servedEscaped], labels, gfdMachineLabel); diff != "" {
				ok, why, text = false, "labels other than gpu.machine differ from the run with escaped links: "+diff, text+", other labels differ"
			}
		}
		row(name).check(t, colGFD, text, ok, why)
	}

	// deviceattribute, the library the DRA drivers publish pcieRoot with,
	// asked as the NVIDIA DRA driver's discovery asks it, for each bus id
	// NVML lists (nvml-list): every GPU has the pcieRoot of its root
	// complex with the tree, and none without it or with plain escaped
	// links. The driver itself runs in TestDRA, where it is supplied.
	dra := map[string][]programs.NVMLDevice{}
	for _, name := range []string{servedTree, servedNone, servedEscaped} {
		dra[name] = s.runNVMLList(t, served[name], x.nvml)
		rooted, problems, _ := pcieRoots(x.nvmlGPUs, dra[name])
		text := fmt.Sprintf("%d/%d GPUs%s", rooted, len(x.nvmlGPUs), x.besidesVFIO())
		if name == servedTree {
			text += rootsSaid(x.nvmlGPUs)
			row(name).check(t, colDRA, text, rooted == len(x.nvmlGPUs) && len(problems) == 0, strings.Join(problems, "; "))
		} else {
			row(name).check(t, colDRA, text+" (none expected)", rooted == 0, "pcieRoot published without a correct link form: "+strings.Join(problems, "; "))
		}
	}

	// NVML (the real mock library) and the served sysfs name the same
	// GPUs, with the same ids, but for those sysfs binds to vfio-pci,
	// which NVML must not list. The stand-in serves verify's own model of
	// nvml-mock's NVML (profile.NVMLGPUs), so with it the comparison would
	// hold by construction: the rows say they were not run.
	nvmlOK := map[string]bool{}
	if s.nvml.StandIn {
		for _, name := range []string{servedTree, servedNone} {
			row(name).notRun(t, colNVML, programs.NotRun("NVML's GPUs against sysfs's and verify's model of NVML (the stand-in serves that model)", programs.MockNVML))
		}
	} else {
		nvml := s.runNVMLList(t, hosttest.Served{}, x.nvml)
		requireNVMLModel(t, x.nvml, nvml)
		for _, name := range []string{servedTree, servedNone} {
			sysfs := readSysfsGPUs(t, served[name])
			text, ok, why := compareNVMLSysfs(x, nvml, sysfs)
			nvmlOK[name] = ok
			if name == servedNone {
				row(name).check(t, colNVML, text, !ok, "NVML and the node's own sysfs agree without the tree: the check cannot fail")
				continue
			}
			row(name).check(t, colNVML, text, ok, why)
			if x.vfio > 0 {
				// The negative control of the passthrough pairing: NVML served
				// the whole profile lists the vfio-pci GPUs, which the check
				// must name.
				_, ok, why := compareNVMLSysfs(x, s.runNVMLList(t, hosttest.Served{}, x.File), sysfs)
				named := strings.Count(why, "which sysfs binds to "+profile.DriverVFIO)
				row(name).check(t, colNVML, fmt.Sprintf("the whole profile to NVML: %d named on %s", named, profile.DriverVFIO), !ok && named == x.vfio,
					fmt.Sprintf("NVML served the whole profile lists its %d GPUs on %s, which the pairing must name: %s", x.vfio, profile.DriverVFIO, why))
			}
		}
	}

	// compat, run in the same namespace, agrees with GFD and the DRA
	// driver on every row they share, and its NVML pairing with the real
	// NVML's.
	for _, name := range []string{servedTree, servedNone, servedEscaped} {
		report := s.runCompat(t, served[name], filepath.Join(x.root, plan.ProfileFile), x.nvml)
		disagreements := compatDisagreements(x, report, gfd[name], dra[name])
		if ok, compared := nvmlOK[name]; compared {
			disagreements = append(disagreements, nvmlDisagreement(report, ok)...)
		}
		text := "agrees"
		if len(disagreements) > 0 {
			text = fmt.Sprintf("%d disagreements", len(disagreements))
		}
		row(name).check(t, colCompat, text, len(disagreements) == 0, strings.Join(disagreements, "; "))
	}

	// nfd-worker: the GPUs' class label with the tree; with the node's own
	// classes whitelisted, the node's labels survive only when the render
	// keeps host devices.
	gpuLabels := map[string]string{}
	for _, c := range x.facts.Classes() {
		gpuLabels[nfdClassLabel(c, boards.VendorNVIDIA)] = "true"
	}
	treeLabels := s.runNFD(t, nfdServed(tree), programs.NFDWorkerRun{})
	row(servedTree).check(t, colNFD, labelNames(treeLabels), maps.Equal(treeLabels, gpuLabels), "want exactly "+labelNames(gpuLabels))
	treeWhitelisted := s.runNFD(t, nfdServed(tree), programs.NFDWorkerRun{DeviceClassWhitelist: s.nfdWhitelist})
	kept := keptLabels(s.nodeNFDLabels, treeWhitelisted)
	hcaLabels, got := hcaClassLabels(x.hcas), pick(treeWhitelisted, anyHCAClassLabel())
	row(servedTree).check(t, colNFD, fmt.Sprintf("%snode's %d/%d (whitelist)", labelList(got), kept, len(s.nodeNFDLabels)),
		maps.Equal(got, hcaLabels), "the HCAs' class labels with the whitelist: want exactly "+labelNames(hcaLabels))
	row(servedTree).check(t, colNFD, "", kept < len(s.nodeNFDLabels), "a render without host devices still shows every node label: the host-device check cannot fail")
	noGPU := !hasAny(s.nodeNFDDefaultLabels, gpuLabels)
	row(servedNone).check(t, colNFD, labelNames(s.nodeNFDDefaultLabels), noGPU, "GPU labels without the tree")
	mergedLabels := s.runNFD(t, nfdServed(x.merged), programs.NFDWorkerRun{DeviceClassWhitelist: s.nfdWhitelist})
	kept = keptLabels(s.nodeNFDLabels, mergedLabels)
	mock := maps.Clone(gpuLabels)
	maps.Copy(mock, hcaLabels)
	row(servedMerged).check(t, colNFD, fmt.Sprintf("%s + node's %d/%d", labelNames(pick(mergedLabels, mock)), kept, len(s.nodeNFDLabels)),
		kept == len(s.nodeNFDLabels) && hasAll(mergedLabels, mock), fmt.Sprintf("want the node's labels %v and %v, got %v", s.nodeNFDLabels, mock, mergedLabels))

	// nfd-worker as the GPU and Network Operators configure it: labels
	// named by vendor, pci-15b3 for the HCAs.
	s.nfdVendorLabels(t, x, tree, row)

	// ghw: every GPU and bridge; the node's own devices only when merged.
	for _, name := range []string{servedTree, servedNone, servedMerged} {
		devices, hcas, bridges := s.nodeGHW, x.hcas, x.bridges
		switch name {
		case servedTree:
			devices = s.runGHW(t, served[name])
		case servedMerged:
			devices, hcas, bridges = s.runGHW(t, hosttest.Served{Root: x.merged}), x.mergedHCAs, x.mergedBridges
		}
		f := ghwFinds(x, bridges, hcas, devices, s.nodeGHW)
		text := fmt.Sprintf("GPUs %d/%d, %sbridges %d/%d, node's %d/%d", f.gpus, len(x.gpus), f.hcaText(hcas), f.bridges, len(bridges), f.host, len(s.nodeGHW))
		switch name {
		case servedTree:
			row(name).check(t, colGHW, text, len(f.problems) == 0 && f.host == 0, strings.Join(f.problems, "; "))
		case servedNone:
			row(name).check(t, colGHW, text, f.gpus == 0 && f.hcas == 0 && f.bridges == 0, "mock devices without the tree")
		case servedMerged:
			// Every bridge of the merged plan is listed as a bridge: the
			// planner keeps them off the node's BDFs.
			row(name).check(t, colGHW, text, len(f.problems) == 0 && f.host == len(s.nodeGHW), strings.Join(f.problems, "; "))
		}
	}

}

// requireNVMLModel checks verify's model of nvml-mock's NVML
// (profile.NVMLGPUs, what its NVML check compares with sysfs) against what
// the real mock NVML reports for the same file: index, bus id in NVML's
// form, and the packed device and subsystem ids, in order.
func requireNVMLModel(t *testing.T, file string, nvml []programs.NVMLDevice) {
	t.Helper()
	p, err := profile.LoadFile(file)
	require.NoError(t, err)
	model, err := profile.NVMLGPUs(file, p)
	require.NoError(t, err)
	var want, got []string
	for _, g := range model {
		want = append(want, fmt.Sprintf("%d %s %08x %08x", g.Index, g.BusID, g.DeviceID, g.SubsystemID))
	}
	for _, d := range nvml {
		got = append(got, fmt.Sprintf("%d %s %08x %08x", d.Index, d.BusID, d.DeviceID, d.SubsystemID))
	}
	require.Equal(t, want, got, "verify's model of nvml-mock's NVML (profile.NVMLGPUs) against the real mock NVML for %s", file)
}

// labelDiff describes how got differs from want outside the ignored keys.
func labelDiff(want, got map[string]string, ignore ...string) string {
	var diffs []string
	for k, v := range want {
		if !slices.Contains(ignore, k) && got[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s: %q -> %q", k, v, got[k]))
		}
	}
	for k, v := range got {
		if _, ok := want[k]; !ok && !slices.Contains(ignore, k) {
			diffs = append(diffs, fmt.Sprintf("%s: new %q", k, v))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, ", ")
}

// pcieRoots counts the GPUs whose device carries the pcieRoot of their
// root complex (the profile's, or the suite's literal where the render
// infers it), and lists every device the driver announced wrongly or not
// at all. A GPU whose root neither gives (an extra profile without
// pcie_topology) is counted when it has a pcieRoot, and named in unjudged.
func pcieRoots(gpus []profilefacts.GPU, devices []programs.NVMLDevice) (rooted int, problems, unjudged []string) {
	byAddr := map[string]programs.NVMLDevice{}
	for _, d := range devices {
		a, err := d.Address()
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		byAddr[a.String()] = d
	}
	for _, g := range gpus {
		d, ok := byAddr[g.BusID]
		if !ok {
			problems = append(problems, fmt.Sprintf("GPU %s not announced", g.BusID))
			continue
		}
		root := d.PCIeRoot
		switch {
		case root == "":
			problems = append(problems, fmt.Sprintf("%s: no pcieRoot (%s)", g.BusID, d.PCIeRootError))
		case g.Root == "":
			unjudged = append(unjudged, g.BusID)
			rooted++
		case root != g.Root:
			problems = append(problems, fmt.Sprintf("%s: pcieRoot %s, want %s", g.BusID, root, g.RootSaid()))
		default:
			rooted++
		}
	}
	if len(byAddr) != len(gpus) {
		problems = append(problems, fmt.Sprintf("%d GPUs announced, the profile has %d", len(byAddr), len(gpus)))
	}
	return rooted, problems, unjudged
}

// rootsSaid says, for a row, which of the GPUs' roots are not the
// profile's: the suite's literals of the render's inference, or none.
func rootsSaid(gpus []profilefacts.GPU) string {
	literal, unknown := 0, 0
	for _, g := range gpus {
		switch g.RootFrom {
		case profilefacts.FromLiteral:
			literal++
		case "":
			unknown++
		}
	}
	var out []string
	if literal > 0 {
		out = append(out, fmt.Sprintf("%d roots %s", literal, profilefacts.FromLiteral))
	}
	if unknown > 0 {
		out = append(out, fmt.Sprintf("%d roots not given by the profile, no literal: present, value not judged", unknown))
	}
	if len(out) == 0 {
		return ""
	}
	return " (" + strings.Join(out, "; ") + ")"
}

// compatDisagreements compares compat's rows with what GFD and the DRA
// driver reported in the same namespace: compat's pcieRoot row for a GPU
// passes exactly when the driver published its root complex, and compat
// has a passing gpu.mode row for every GPU (it has none for a GPU go-nvlib
// cannot find) exactly when GFD labelled the profile's mode.
func compatDisagreements(x *subject, report *compat.Report, gfd map[string]string, dra []programs.NVMLDevice) []string {
	rootOK := map[string]bool{}
	modeOK := 0
	for _, r := range report.Results {
		switch {
		case r.Check == compat.PCIeRoot:
			rootOK[r.Device] = r.OK
		case r.Check == compat.GPUMode && r.OK:
			modeOK++
		}
	}
	var out []string
	// With GPUs of different classes GFD labels unknown with or without
	// the tree, so its label says nothing to compare.
	if gfdOK, compatOK := gfd[gfdModeLabel] == x.mode, modeOK == len(x.gpus); x.mode != "unknown" && gfdOK != compatOK {
		out = append(out, fmt.Sprintf("gpu.mode: compat passes %d of %d GPUs, GFD labelled %s (profile: %s)", modeOK, len(x.gpus), gfd[gfdModeLabel], x.mode))
	}
	driverRoot := map[string]string{}
	for _, d := range dra {
		if a, err := d.Address(); err == nil {
			driverRoot[a.String()] = d.PCIeRoot
		}
	}
	// The driver sees the GPUs NVML lists; compat's pcieRoot rows are of
	// every GPU in sysfs.
	for _, g := range x.nvmlGPUs {
		bdf := g.BusID
		if g.Root == "" {
			// Neither the profile nor a literal gives the root to judge the
			// driver's by.
			continue
		}
		if draOK := driverRoot[bdf] == g.Root; draOK != rootOK[bdf] {
			out = append(out, fmt.Sprintf("%s pcieRoot: compat passes=%v, the driver published %q", bdf, rootOK[bdf], driverRoot[bdf]))
		}
	}
	return out
}

// nvmlDisagreement compares compat's NVML pairing (compat.NVMLCheck: the
// profile's model of NVML, go-nvlib's drivers) with the suite's of the
// real NVML and the served sysfs (compareNVMLSysfs): they must pass and
// fail together.
func nvmlDisagreement(report *compat.Report, suiteOK bool) []string {
	for _, r := range report.Results {
		if r.Check == compat.NVMLAgreement {
			if r.OK != suiteOK {
				return []string{fmt.Sprintf("NVML pairing: compat passes=%v (%s), the real NVML's passes=%v", r.OK, r.Detail, suiteOK)}
			}
			return nil
		}
	}
	return []string{"compat reported no " + compat.NVMLAgreement + " row"}
}

func labelNames(labels map[string]string) string {
	if len(labels) == 0 {
		return "no labels"
	}
	var names []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		names = append(names, strings.TrimSuffix(strings.TrimPrefix(k, "feature.node.kubernetes.io/"), ".present"))
	}
	return strings.Join(names, " ")
}

func keptLabels(want, got map[string]string) int {
	n := 0
	for k, v := range want {
		if got[k] == v {
			n++
		}
	}
	return n
}

func hasAll(labels, want map[string]string) bool { return keptLabels(want, labels) == len(want) }

func hasAny(labels, want map[string]string) bool { return keptLabels(want, labels) > 0 }

func pick(labels, keys map[string]string) map[string]string {
	out := map[string]string{}
	for k := range keys {
		if v, ok := labels[k]; ok {
			out[k] = v
		}
	}
	return out
}

// ghwFound is what ghw listed of a profile and of the node.
type ghwFound struct {
	gpus, bridges, host int
	// hcas are the HCAs listed as planned; underSwitch of them hang from
	// a downstream port of their GPU's own switch, the rest from a root
	// port of their own.
	hcas, underSwitch int
	problems          []string
}

// ghwFinds counts the profile's GPUs (vendor 10de, their class), the HCAs
// of the plan served (findHCAs), its bridges and the node's own devices (with their own vendor and class)
// among what ghw listed.
func ghwFinds(x *subject, bridges []string, hcas []plan.HCA, devices []programs.GHWDevice, node []programs.GHWDevice) ghwFound {
	var f ghwFound
	byAddr := map[string]programs.GHWDevice{}
	for _, d := range devices {
		byAddr[d.Address] = d
	}
	nodeByAddr := map[string]programs.GHWDevice{}
	for _, d := range node {
		nodeByAddr[d.Address] = d
	}
	for _, g := range x.gpus {
		d, ok := byAddr[g.BusID]
		want := fmt.Sprintf("10de %04x", g.Class>>8)
		switch got := d.Vendor + " " + d.Class + d.Subclass; {
		case !ok:
			f.problems = append(f.problems, g.BusID+" not listed")
		case got != want:
			f.problems = append(f.problems, fmt.Sprintf("%s: vendor and class %s, want %s", g.BusID, got, want))
		default:
			f.gpus++
		}
	}
	f.findHCAs(hcas, byAddr)
	for _, b := range bridges {
		d, ok := byAddr[b]
		switch {
		case ok && d.Class == "06":
			f.bridges++
		default:
			f.problems = append(f.problems, "bridge "+b+" not listed as class 06")
		}
	}
	for addr, want := range nodeByAddr {
		if got, ok := byAddr[addr]; ok && got == want {
			f.host++
		}
	}
	return f
}

// sysfsGPU is an NVIDIA display-class function as the served sysfs shows it.
type sysfsGPU struct {
	Address                    string
	Device, SubsystemID, Class uint32
	// Driver is the basename of its driver link, "-" with none (a bridge
	// or a function no driver holds).
	Driver string
}

// readSysfsGPUs reads, inside the namespace, every NVIDIA function of
// display class in /sys/bus/pci/devices, with its ids as NVML packs them
// and the driver it is bound to.
func readSysfsGPUs(t *testing.T, s hosttest.Served) map[string]sysfsGPU {
	t.Helper()
	stdout, stderr, err := s.Shell(`cd /sys/bus/pci/devices
for d in *; do
	drv=$(readlink $d/driver || true)
	echo "$d $(cat $d/vendor) $(cat $d/device) $(cat $d/subsystem_vendor) $(cat $d/subsystem_device) $(cat $d/class) ${drv##*/}"
done`)
	require.NoError(t, err, "%s", stderr)
	out := map[string]sysfsGPU{}
	for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
		f := strings.Fields(line)
		if len(f) == 6 {
			f = append(f, "-")
		}
		require.Len(t, f, 7, "sysfs line %q", line)
		var v [5]uint64
		for i := range v {
			v[i], err = strconv.ParseUint(f[i+1], 0, 32)
			require.NoError(t, err, "sysfs line %q", line)
		}
		if v[0] != 0x10de || v[4]>>16 != 0x03 {
			continue
		}
		out[f[0]] = sysfsGPU{Address: f[0], Device: uint32(v[1]<<16 | v[0]), SubsystemID: uint32(v[3]<<16 | v[2]), Class: uint32(v[4]), Driver: f[6]}
	}
	return out
}

// compareNVMLSysfs checks that NVML's GPUs and the sysfs GPUs not bound to
// vfio-pci are the same set, with the same device and subsystem ids
// (compat.NVMLCheck's rule, written again here), and names every GPU
// NVML reports that sysfs binds to vfio-pci: a real passthrough node's
// NVML lists none (docs/user/passthrough.md).
func compareNVMLSysfs(x *subject, nvml []programs.NVMLDevice, sysfs map[string]sysfsGPU) (string, bool, string) {
	// The suite's own pairing, written apart from profile.MatchIdentities
	// (compat's and verify's rule), so that each checks the other: both
	// sides as text, NVML's bus id in sysfs's form and its packed ids as
	// it reports them, sysfs's as read from its files.
	var problems []string
	shown, vfio := map[string]sysfsGPU{}, map[string]bool{}
	for _, g := range sysfs {
		if g.Driver == profile.DriverVFIO {
			vfio[g.Address] = true
			continue
		}
		shown[g.Address] = g
	}
	matched := 0
	reported := map[string]bool{}
	for _, d := range nvml {
		a, err := d.Address()
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		bdf := a.String()
		reported[bdf] = true
		g, ok := shown[bdf]
		switch {
		case vfio[bdf]:
			problems = append(problems, fmt.Sprintf("NVML reports %s (device %08x), which sysfs binds to %s: a real node's NVML lists no GPU bound for passthrough", bdf, d.DeviceID, profile.DriverVFIO))
		case !ok:
			problems = append(problems, fmt.Sprintf("NVML reports %s (%08x), sysfs has no GPU there", bdf, d.DeviceID))
		case d.DeviceID != g.Device:
			problems = append(problems, fmt.Sprintf("%s: NVML reports device %08x, sysfs %08x", bdf, d.DeviceID, g.Device))
		case d.SubsystemID != 0 && d.SubsystemID != g.SubsystemID:
			// NVML reports 0 for a subsystem its profile does not give.
			problems = append(problems, fmt.Sprintf("%s: NVML reports subsystem %08x, sysfs %08x", bdf, d.SubsystemID, g.SubsystemID))
		default:
			matched++
		}
	}
	for _, bdf := range slices.Sorted(maps.Keys(shown)) {
		if !reported[bdf] {
			problems = append(problems, fmt.Sprintf("sysfs shows GPU %s, NVML reports none there", bdf))
		}
	}
	if len(nvml) != len(x.nvmlGPUs) {
		problems = append(problems, fmt.Sprintf("NVML reports %d GPUs, the profile has %d not bound to %s", len(nvml), len(x.nvmlGPUs), profile.DriverVFIO))
	}
	text := fmt.Sprintf("%d of NVML's %d in sysfs's %d", matched, len(nvml), len(shown))
	if len(vfio) > 0 {
		text += fmt.Sprintf(" (besides %d on %s)", len(vfio), profile.DriverVFIO)
	}
	return text, len(problems) == 0, strings.Join(problems, "; ")
}

// The runs. Each counts toward the matrix's total and fails the test,
// with the program's output, if the program fails.

func (s *suite) run(t *testing.T, what string, cmd *exec.Cmd) (stdout, stderr []byte) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	s.matrix.runs.Add(1)
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s: %v\nstdout:\n%s\nstderr:\n%s", what, err, out.Bytes(), errOut.Bytes())
	}
	return out.Bytes(), errOut.Bytes()
}

// specEnv is the environment the standalone CDI spec of the render in root
// gives a served container: the device's variables, as the runtime sets
// them.
func specEnv(t *testing.T, root string) []string {
	t.Helper()
	mounts, err := cdispec.Mounts(root, plan.DefaultContainerRoot, nil)
	require.NoError(t, err)
	spec, err := cdispec.NewSpec(cdispec.DefaultKind, mounts, cdispec.Env(os.DirFS(root), plan.DefaultContainerRoot))
	require.NoError(t, err)
	return spec.Devices[0].ContainerEdits.Env
}

// gfdNoVendor is what GFD v0.17.4 says when it exits for a GPU NVML lists
// whose PCI vendor sysfs lacks.
const gfdNoVendor = "unable to read PCI device vendor id"

// runGFD runs GFD once and returns its labels, or, where it exits with an
// error, no labels and its last line of output.
func (s *suite) runGFD(t *testing.T, served hosttest.Served, prof, strategy string) (map[string]string, string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "gfd-labels")
	r := programs.GFDRun{Binary: s.gfd, NVMLDir: s.nvml.Dir, Profile: prof, OutputFile: file, Strategy: strategy}
	cmd := r.Invocation().In(served)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	s.matrix.runs.Add(1)
	if err := cmd.Run(); err != nil {
		// Its last line, from GFD's own reason on: klog's header and the
		// open's error after the device add nothing.
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		last := lines[len(lines)-1]
		if i := strings.Index(last, gfdNoVendor); i >= 0 {
			last, _, _ = strings.Cut(last[i:], ": ")
		}
		return nil, last
	}
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	labels, err := programs.ParseGFDLabels(data)
	require.NoError(t, err)
	return labels, ""
}

// runNFD runs nfd-worker with r's PCI source config.
func (s *suite) runNFD(t *testing.T, served hosttest.Served, r programs.NFDWorkerRun) map[string]string {
	t.Helper()
	r.Binary, r.Kubeconfig = s.nfd, s.kubeconfig
	inv, err := r.Invocation()
	require.NoError(t, err)
	_, stderr := s.run(t, "nfd-worker", inv.In(served))
	labels, err := programs.ParseNFDLabels(stderr)
	require.NoError(t, err)
	return labels
}

func (s *suite) runGHW(t *testing.T, served hosttest.Served) []programs.GHWDevice {
	t.Helper()
	stdout, _ := s.run(t, "ghw-list", programs.GHWListRun{Binary: s.ghw}.Invocation().In(served))
	devices, err := programs.ParseGHWDevices(stdout)
	require.NoError(t, err)
	return devices
}

// runNVMLList runs nvml-list served as asked: NVML's GPUs and
// deviceattribute's pcieRoot of each in that sysfs.
func (s *suite) runNVMLList(t *testing.T, served hosttest.Served, prof string) []programs.NVMLDevice {
	t.Helper()
	inv := programs.NVMLListRun{Binary: s.nvmlList, NVMLDir: s.nvml.Dir, Profile: prof}.Invocation()
	stdout, _ := s.run(t, "nvml-list", inv.In(served))
	devices, err := programs.ParseNVMLDevices(stdout)
	require.NoError(t, err)
	return devices
}

func (s *suite) runCompat(t *testing.T, served hosttest.Served, effective, nvmlProfile string) *compat.Report {
	t.Helper()
	stdout, _ := s.run(t, "compat", served.Reexec(t, compatChild, effective, nvmlProfile))
	var r compat.Report
	require.NoError(t, json.Unmarshal(stdout, &r))
	return &r
}
