package plan_test

import (
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/internal/plancheck"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/plan"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/shipped"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/writer"
)

// moduleView is what a plan's module view holds, by module: its holders
// and refcnt, read from the planned entries as a reader of /sys/module
// would read them.
type moduleView struct {
	Holders []string
	Refcnt  string
	Drivers []string
}

func readModuleView(t *testing.T, p *plan.Plan) map[string]moduleView {
	t.Helper()
	fs := files(p)
	out := map[string]moduleView{}
	for _, name := range p.Modules {
		dir := plan.ModulesDir + "/" + name
		require.Equal(t, "live\n", text(t, fs, dir+"/initstate"), name)
		v := moduleView{Refcnt: text(t, fs, dir+"/refcnt")}
		for _, e := range p.Entries {
			switch path.Dir(e.Path) {
			case dir + "/holders":
				require.Equal(t, "../../"+path.Base(e.Path), e.Target, "a holder links its sibling, as the kernel's")
				v.Holders = append(v.Holders, path.Base(e.Path))
			case dir + "/drivers":
				v.Drivers = append(v.Drivers, path.Base(e.Path))
			}
		}
		out[name] = v
	}
	return out
}

// The holder graph and refcnt per profile: a PCIe board without HCAs has
// the driver container's stack alone; an HGX tray with HCAs adds the
// HCAs' stack and nvidia_peermem, which holds both nvidia and ib_core; a
// passthrough node adds vfio_pci's. refcnt counts the holders.
func TestModuleViewHolderGraph(t *testing.T) {
	nvidiaStack := map[string]moduleView{
		"nvidia":         {Holders: []string{"nvidia_modeset", "nvidia_uvm"}, Refcnt: "2\n", Drivers: []string{"pci:nvidia"}},
		"nvidia_uvm":     {Refcnt: "0\n"},
		"nvidia_modeset": {Refcnt: "0\n"},
	}
	hca := map[string]moduleView{
		"nvidia":         {Holders: []string{"nvidia_modeset", "nvidia_peermem", "nvidia_uvm"}, Refcnt: "3\n", Drivers: []string{"pci:nvidia", "pci:nvidia-nvswitch"}},
		"nvidia_uvm":     {Refcnt: "0\n"},
		"nvidia_modeset": {Refcnt: "0\n"},
		"nvidia_peermem": {Refcnt: "0\n"},
		"mlx5_core":      {Holders: []string{"mlx5_ib"}, Refcnt: "1\n", Drivers: []string{"pci:mlx5_core"}},
		"mlx5_ib":        {Refcnt: "0\n"},
		"ib_core":        {Holders: []string{"mlx5_ib", "nvidia_peermem"}, Refcnt: "2\n"},
	}
	vfio := map[string]moduleView{
		"nvidia":           nvidiaStack["nvidia"],
		"nvidia_uvm":       {Refcnt: "0\n"},
		"nvidia_modeset":   {Refcnt: "0\n"},
		"vfio_pci":         {Refcnt: "0\n", Drivers: []string{"pci:vfio-pci"}},
		"vfio_pci_core":    {Holders: []string{"vfio_pci"}, Refcnt: "1\n"},
		"vfio_iommu_type1": {Refcnt: "0\n"},
		"vfio":             {Holders: []string{"vfio_iommu_type1", "vfio_pci", "vfio_pci_core"}, Refcnt: "3\n"},
	}
	shared := overlaytest.SharedTestdata(t, "nvml-mock-profiles")
	for _, c := range []struct {
		profile string
		want    map[string]moduleView
	}{
		{"t4-vm", nvidiaStack},
		{filepath.Join(shared, "t4.yaml"), nvidiaStack},
		{"hgx-h100", hca},
		{filepath.Join(shared, "h100.yaml"), hca},
		{"../../testdata/profiles/vfio-passthrough.yaml", vfio},
	} {
		t.Run(filepath.Base(c.profile), func(t *testing.T) {
			m := machine(t, c.profile, "")
			p := mustPlan(t, m, plan.Options{})
			require.Equal(t, c.want, readModuleView(t, p))
			version := text(t, files(p), plan.ModulesDir+"/nvidia/version")
			require.Equal(t, m.NVIDIAVersion()+"\n", version)
			require.NotContains(t, p.Modules, "nvidia_drm", "the GPU Operator's driver container loads none")
		})
	}
}

// The profile's driver version is nvidia's version, the default NVML's
// where the profile gives none; a version the kernel could not print as
// one word is refused, naming the file, the field and the value.
func TestModuleViewVersion(t *testing.T) {
	p, _ := shipped.Get("t4-vm")
	p.System.DriverVersion = "580.65.06"
	pl := mustPlan(t, normalize(t, p), plan.Options{})
	require.Equal(t, "580.65.06\n", text(t, files(pl), plan.ModulesDir+"/nvidia_uvm/version"))
	p.System.DriverVersion = ""
	pl = mustPlan(t, normalize(t, p), plan.Options{})
	require.Equal(t, profile.MockNVMLDriverVersion+"\n", text(t, files(pl), plan.ModulesDir+"/nvidia/version"))
	p.System.DriverVersion = "580.65.06\nlive"
	_, err := profile.Normalize("bad.yaml", p, profile.Options{})
	require.EqualError(t, err, `profile bad.yaml: system.driver_version: value "580.65.06\nlive": want one version such as 550.163.01, without spaces or control characters`)
}

// Every drivers/pci:<driver> link resolves to the tree's driver directory,
// which links back the devices bound to it: in memory from the overlay
// root; on disk through the loop link, as on the host and in a container
// at the container root; and with the view alone at /sys/module of a
// container whose /sys/bus is the kernel's. A PCI driver is listed iff its module is
// rendered, in the rendered and the writable tree.
func TestModuleViewDriversAgree(t *testing.T) {
	for _, name := range []string{"t4-vm", "hgx-h100", "../../testdata/profiles/vfio-passthrough.yaml"} {
		for _, writable := range []bool{false, true} {
			t.Run(filepath.Base(name)+map[bool]string{true: "/writable"}[writable], func(t *testing.T) {
				m := machine(t, name, "")
				root, p := overlaytest.Render(t, m, plan.Options{Writable: writable})
				tree := plancheck.FromEntries(p.Entries)
				var linked []string
				for _, e := range p.Entries {
					if path.Dir(path.Dir(path.Dir(e.Path))) != plan.ModulesDir || path.Base(path.Dir(e.Path)) != "drivers" {
						continue
					}
					driver := strings.TrimPrefix(path.Base(e.Path), "pci:")
					linked = append(linked, driver)
					want := plan.DriversDir + "/" + driver
					got, err := tree.Resolve(e.Path)
					require.NoError(t, err, e.Path)
					require.Equal(t, want, got, e.Path)
					onDisk, err := filepath.EvalSymlinks(filepath.Join(root, e.Path))
					require.NoError(t, err, e.Path)
					wantOnDisk, err := filepath.EvalSymlinks(filepath.Join(root, want))
					require.NoError(t, err)
					require.Equal(t, wantOnDisk, onDisk, e.Path)
				}
				// The view mounted at /sys/module of a container whose
				// /sys is the kernel's: a copy of it (links kept, as a bind
				// mount keeps them) under a stand-in container root, whose
				// container path leads to the overlay.
				ctr := t.TempDir()
				copyTree(t, filepath.Join(root, plan.ModulesDir), filepath.Join(ctr, "sys", "module"))
				require.NoError(t, os.MkdirAll(filepath.Join(ctr, "opt"), 0o755))
				require.NoError(t, os.Symlink(root, filepath.Join(ctr, strings.TrimPrefix(plan.DefaultContainerRoot, "/"))))
				for _, d := range linked {
					m := moduleOf(t, d)
					got, err := filepath.EvalSymlinks(filepath.Join(ctr, "sys", "module", m, "drivers", "pci:"+d))
					require.NoError(t, err, "%s's drivers/pci:%s with the view at /sys/module", m, d)
					want, err := filepath.EvalSymlinks(filepath.Join(root, plan.DriversDir, d))
					require.NoError(t, err)
					require.Equal(t, want, got)
				}
				listed := slices.DeleteFunc(slices.Clone(p.Drivers), func(d string) bool { return d == plan.DriverPCIePort })
				slices.Sort(linked)
				require.Equal(t, listed, linked, "a driver is listed iff its module links it")
				if writable && len(p.Tree.HCAs) == 0 {
					require.NotContains(t, p.Drivers, profile.DriverMLX5, "no HCAs: mlx5_core is not loaded")
				}
				for _, f := range p.Functions {
					if f.State.Driver == "" || f.State.Driver == plan.DriverPCIePort {
						continue
					}
					require.FileExists(t, filepath.Join(root, plan.ModulesDir, moduleOf(t, f.State.Driver), "drivers", "pci:"+f.State.Driver, f.Address.String(), "vendor"))
				}
			})
		}
	}
}

// copyTree copies the directories, files and links below src to dst.
func copyTree(t *testing.T, src, dst string) {
	t.Helper()
	require.NoError(t, filepath.WalkDir(src, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, data, 0o644)
	}))
}

// moduleOf names the module registering driver.
func moduleOf(t *testing.T, driver string) string {
	for _, m := range plan.KernelModules() {
		if slices.Contains(m.Drivers, driver) {
			return m.Name
		}
	}
	t.Fatalf("no module registers %s", driver)
	return ""
}

// A re-profile re-renders the view: the tray's HCAs go, and mlx5_core,
// mlx5_ib, ib_core and nvidia_peermem with them, from the disk too, under
// the same completion marker.
func TestModuleViewReProfile(t *testing.T) {
	root := t.TempDir()
	apply := func(m *profile.Machine) *plan.Plan {
		p := mustPlan(t, m, plan.Options{})
		_, err := writer.Apply(root, p, writer.Options{SkipSync: true})
		require.NoError(t, err)
		_, err = writer.ReadMarker(os.DirFS(root))
		require.NoError(t, err, "the completion marker vouches for the view")
		return p
	}
	with := apply(machine(t, "hgx-h100", ""))
	require.Subset(t, with.Modules, []string{"mlx5_core", "mlx5_ib", "ib_core", "nvidia_peermem"})
	require.DirExists(t, filepath.Join(root, plan.ModulesDir, "mlx5_core"))
	m := machine(t, "hgx-h100", "")
	m.HCAs = nil
	without := apply(m)
	require.Equal(t, []string{"nvidia", "nvidia_uvm", "nvidia_modeset"}, without.Modules)
	ents, err := os.ReadDir(filepath.Join(root, plan.ModulesDir))
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.ElementsMatch(t, without.Modules, names, "the HCAs' modules are gone from the disk")
	holders, err := os.ReadDir(filepath.Join(root, plan.ModulesDir, "nvidia", "holders"))
	require.NoError(t, err)
	require.Len(t, holders, 2, "nvidia_peermem no longer holds nvidia")
}

// The node's own modules, read through the seam, stay listed beside ours:
// each a link through the mount point of the node's /sys/module, which
// leads on to the node's sysfs where nothing is mounted. A node module of
// one of our names is ours in the view, and stays the node's at the mount
// point.
func TestModuleViewNodeModules(t *testing.T) {
	host := fstest.MapFS{
		"module/nvme/parameters/io_timeout": {Data: []byte("30\n")},
		"module/nvidia/initstate":           {Data: []byte("live\n")},
		"module/vfio/parameters/x":          {Data: []byte("1\n")},
	}
	node, err := plan.ReadHostModules(host)
	require.NoError(t, err)
	require.Equal(t, []string{"nvidia", "nvme", "vfio"}, node)
	none, err := plan.ReadHostModules(fstest.MapFS{})
	require.NoError(t, err)
	require.Empty(t, none, "a sysfs without module/ has no modules")

	hostSysfs := t.TempDir()
	for _, n := range node {
		require.NoError(t, os.MkdirAll(filepath.Join(hostSysfs, "module", n), 0o755))
	}
	m := machine(t, "t4-vm", "")
	root, p := overlaytest.Render(t, m, plan.Options{HostModules: node, HostSysfs: hostSysfs})
	tree := plancheck.FromEntries(p.Entries)
	// nvme and vfio are the node's: through the mount point to the node.
	for _, n := range []string{"nvme", "vfio"} {
		_, err := tree.Resolve(plan.ModulesDir + "/" + n)
		var esc *plancheck.EscapeError
		require.ErrorAs(t, err, &esc, n)
		require.Equal(t, plan.HostModulesDir+"/"+n, esc.Link, "through the mount point")
		require.Equal(t, filepath.Join(hostSysfs, "module", n), esc.Target)
		got, err := filepath.EvalSymlinks(filepath.Join(root, plan.ModulesDir, n))
		require.NoError(t, err)
		require.Equal(t, filepath.Join(hostSysfs, "module", n), got)
	}
	// nvidia is ours: a directory with the profile's version.
	info, err := os.Lstat(filepath.Join(root, plan.ModulesDir, "nvidia"))
	require.NoError(t, err)
	require.True(t, info.IsDir(), "ours wins the name")
	got, err := filepath.EvalSymlinks(filepath.Join(root, plan.HostModulesDir, "nvidia"))
	require.NoError(t, err)
	require.Equal(t, filepath.Join(hostSysfs, "module", "nvidia"), got, "the node's nvidia stays reachable")
	ents, err := os.ReadDir(filepath.Join(root, plan.ModulesDir))
	require.NoError(t, err)
	require.Len(t, ents, len(p.Modules)+2, "ours and the node's two others")
}

// A node module whose name no module has is refused, one line naming it.
func TestModuleViewBadNodeModule(t *testing.T) {
	_, err := plan.ReadHostModules(fstest.MapFS{"module/bad name/x": {}})
	require.EqualError(t, err, `read node modules in module: node module "bad name": not a module name (letters, digits, '_', '-' and '.')`)
	_, err = plan.New(machine(t, "t4-vm", ""), plan.Options{HostModules: []string{".."}})
	require.ErrorContains(t, err, `node module "..": not a module name`)
}

// The mount point of the node's own /sys/module is planned even where the
// node lists no module: the mount set mounts the node's /sys/module there
// whatever it holds, and a runtime fails a container whose bind mount has
// no target.
func TestModuleViewNodeMountPointWithoutNodeModules(t *testing.T) {
	p, err := plan.New(machine(t, "t4-vm", ""), plan.Options{})
	require.NoError(t, err)
	require.True(t, slices.ContainsFunc(p.Entries, func(e plan.Entry) bool {
		return e.Path == plan.HostModulesDir && e.Kind == plan.Dir
	}), "%s planned", plan.HostModulesDir)
}
