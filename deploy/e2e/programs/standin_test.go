package programs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/profile"
)

// standInTestProfile exercises every rule of StandInConfig: devices out of
// address order (NVML lists them by index, as nvml-mock does), one
// identified by ServableProfile's rule (index 1), one bound to vfio-pci
// (listed all the same: NVMLProfile drops it, for either NVML), one
// overriding the defaults' memory, compute capability, MIG and subsystem
// (index 3).
const standInTestProfile = `version: "1.0"
system:
  driver_version: "580.65.06"
  cuda_version: "13.0"
device_defaults:
  name: "NVIDIA H100 80GB HBM3"
  compute_capability: {major: 9, minor: 0}
  memory: {total_bytes: 85899345920}
  mig: {mode_current: "disabled", max_gpu_instances: 7}
  pci: {device_id: 0x233010DE, subsystem_id: 0x16C110DE}
devices:
  - {index: 0, uuid: "GPU-00000000-0000-0000-0000-000000000000", minor_number: 4, pci: {bus_id: "0000:CB:00.0"}}
  - {index: 1, pci: {bus_id: "0000:1A:00.0"}}
  - {index: 2, uuid: "GPU-22222222-0000-0000-0000-000000000000", minor_number: 2, pci: {bus_id: "0000:4A:00.0", driver: vfio-pci}}
  - {index: 3, uuid: "GPU-33333333-0000-0000-0000-000000000000", minor_number: 3, memory: {total_bytes: 100000}, compute_capability: {major: 9, minor: 1}, mig: {max_gpu_instances: 0}, pci: {bus_id: "0000:8a:00.0", subsystem_id: 0x16C010DE}}
`

// derivedUUID is the uuid ServableProfile gives devices[1] of
// standInTestProfile (a digest of its index and bus id).
const derivedUUID = "GPU-df082344-a1e9-f751-30ae-316c37001f18"

const standInTestConfig = `# The NVML stand-in's GPUs, from an nvml-mock profile (WriteStandInConfig; nvml.c documents the format).
driver 580.65.06
cuda 13000
gpu 00000000:CB:00.0 0x233010DE 0x16C110DE 85899345920 9 0 7 4 GPU-00000000-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
gpu 00000000:1A:00.0 0x233010DE 0x16C110DE 85899345920 9 0 7 1 ` + derivedUUID + ` NVIDIA H100 80GB HBM3
gpu 00000000:4A:00.0 0x233010DE 0x16C110DE 85899345920 9 0 7 2 GPU-22222222-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
gpu 00000000:8A:00.0 0x233010DE 0x16C010DE 100000 9 1 0 3 GPU-33333333-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
`

func TestWriteStandInConfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stand-in.conf")
	if err := WriteStandInConfig(path, []byte(standInTestProfile)); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != standInTestConfig {
		t.Errorf("WriteStandInConfig wrote\n%s\nwant\n%s", got, standInTestConfig)
	}
}

// The stand-in and nvml-mock (given ServableProfile's file) must name a
// GPU the profile leaves unidentified by the same uuid, or a suite that
// switches NVMLs would see other GPUs.
func TestStandInUUIDIsServableProfiles(t *testing.T) {
	file, err := ServableProfile(t.TempDir(), "test", "", []byte(standInTestProfile))
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Devices []struct {
			UUID string `yaml:"uuid"`
		} `yaml:"devices"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Devices) < 2 || doc.Devices[1].UUID != derivedUUID {
		t.Errorf("ServableProfile gives devices[1] %+v, the stand-in %s", doc.Devices, derivedUUID)
	}
}

func TestStandInConfigDefaults(t *testing.T) {
	// A profile written for the renderer alone: no system block, no name
	// (the board's, by device id), no subsystem (0, as nvml-mock reports),
	// no memory, compute capability, MIG, uuid or minor number.
	const bare = `device_defaults:
  pci: {device_id: 0x234010DE}
devices:
  - {index: 0, pci: {bus_id: "0000:1B:00.0"}}
`
	got, err := StandInConfig("bare.yaml", []byte(bare))
	if err != nil {
		t.Fatal(err)
	}
	want := `# The NVML stand-in's GPUs, from an nvml-mock profile (WriteStandInConfig; nvml.c documents the format).
driver ` + profile.MockNVMLDriverVersion + `
cuda 12040
gpu 00000000:1B:00.0 0x234010DE 0x00000000 0 0 0 0 0 GPU-e3ae105d-6942-9eee-4bcc-ad73b541760e NVIDIA B200
`
	if string(got) != want {
		t.Errorf("StandInConfig gave\n%s\nwant\n%s", got, want)
	}
}

func TestStandInConfigRefuses(t *testing.T) {
	for _, c := range []struct {
		name, old, new, want string
	}{
		{
			"mig enabled by default",
			`mig: {mode_current: "disabled"`, `mig: {mode_current: "enabled"`,
			`profile test.yaml: device_defaults.mig.mode_current: value "enabled": the NVML stand-in serves no MIG devices: want disabled`,
		},
		{
			"cuda without a minor",
			`cuda_version: "13.0"`, `cuda_version: "13"`,
			`profile test.yaml: system.cuda_version: value "13": want major.minor such as 12.4`,
		},
		{
			"uuid with a space",
			`uuid: "GPU-33333333-0000-0000-0000-000000000000"`, `uuid: "GPU 3"`,
			`profile test.yaml: devices[3].uuid: value "GPU 3": want a uuid without spaces, shorter than 96 bytes`,
		},
		{
			"own compute capability out of range",
			`compute_capability: {major: 9, minor: 1}`, `compute_capability: {major: 9, minor: -1}`,
			`profile test.yaml: devices[3].compute_capability: value "9.-1": want a major and a minor of 0..1000`,
		},
		{
			"driver with a space",
			`driver_version: "580.65.06"`, `driver_version: "580 65"`,
			`profile test.yaml: system.driver_version: value "580 65": want one version such as 550.163.01`,
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !strings.Contains(standInTestProfile, c.old) {
				t.Fatalf("the test profile has no %q", c.old)
			}
			_, err := StandInConfig("test.yaml", []byte(strings.Replace(standInTestProfile, c.old, c.new, 1)))
			if err == nil || err.Error() != c.want {
				t.Errorf("StandInConfig: %v\nwant %s", err, c.want)
			}
		})
	}
}

// standInCheck is a C program of ours that loads the stand-in with dlopen,
// as go-nvml does, resolves every entry point GFD v0.17.4 and nvml-list
// call, and prints what they answer.
const standInCheck = `#include <dlfcn.h>
#include <stdio.h>

typedef struct { char legacy[16]; unsigned domain, bus, device, id, sub; char busId[32]; } pci_t;
typedef struct { unsigned long long total, free, used; } mem_t;

static void *lib;
static void *sym(const char *name)
{
	void *f = dlsym(lib, name);
	if (f == NULL) { printf("missing %s\n", name); }
	return f;
}

int main(int argc, char **argv)
{
	(void)argc;
	lib = dlopen(argv[1], RTLD_NOW | RTLD_GLOBAL);
	if (lib == NULL) { printf("dlopen: %s\n", dlerror()); return 1; }
	int (*init)(void) = sym("nvmlInit_v2");
	int (*shutdown)(void) = sym("nvmlShutdown");
	const char *(*errstr)(int) = sym("nvmlErrorString");
	int (*driver)(char *, unsigned) = sym("nvmlSystemGetDriverVersion");
	int (*cuda)(int *) = sym("nvmlSystemGetCudaDriverVersion");
	int (*count)(unsigned *) = sym("nvmlDeviceGetCount_v2");
	int (*handle)(unsigned, void **) = sym("nvmlDeviceGetHandleByIndex_v2");
	int (*pci)(void *, pci_t *) = sym("nvmlDeviceGetPciInfo_v3");
	int (*name)(void *, char *, unsigned) = sym("nvmlDeviceGetName");
	int (*memory)(void *, mem_t *) = sym("nvmlDeviceGetMemoryInfo");
	int (*cc)(void *, int *, int *) = sym("nvmlDeviceGetCudaComputeCapability");
	int (*migMode)(void *, unsigned *, unsigned *) = sym("nvmlDeviceGetMigMode");
	int (*migMax)(void *, unsigned *) = sym("nvmlDeviceGetMaxMigDeviceCount");
	int (*uuid)(void *, char *, unsigned) = sym("nvmlDeviceGetUUID");
	int (*minor)(void *, unsigned *) = sym("nvmlDeviceGetMinorNumber");
	if (!init || !shutdown || !errstr || !driver || !cuda || !count || !handle || !pci || !name || !memory || !cc || !migMode || !migMax || !uuid || !minor)
		return 1;
	int r = init();
	if (r != 0) { printf("nvmlInit_v2: %d %s\n", r, errstr(r)); return 1; }
	char d[80], n[96], u[96];
	int c;
	unsigned gpus;
	driver(d, sizeof d);
	cuda(&c);
	count(&gpus);
	printf("driver %s cuda %d gpus %u\n", d, c, gpus);
	for (unsigned i = 0; i < gpus; i++) {
		void *h;
		pci_t p;
		mem_t m;
		int major, minorCC;
		unsigned cur = 9, pend = 9, max = 0, mn;
		handle(i, &h);
		pci(h, &p);
		name(h, n, sizeof n);
		uuid(h, u, sizeof u);
		minor(h, &mn);
		int mr = memory(h, &m);
		cc(h, &major, &minorCC);
		int gr = migMode(h, &cur, &pend);
		migMax(h, &max);
		printf("%u %s %s %x:%x:%x 0x%08X 0x%08X mem %d %llu cc %d.%d mig %d %u/%u max %u minor %u %s %s\n",
			i, p.busId, p.legacy, p.domain, p.bus, p.device, p.id, p.sub, mr, mr == 0 ? m.total : 0,
			major, minorCC, gr, cur, pend, max, mn, u, n);
	}
	int first = shutdown();
	printf("shutdown %d, again %d\n", first, shutdown());
	return 0;
}
`

// TestNVMLStandInServesConfig builds the stand-in with NVMLStandIn's own
// step and checks, through standInCheck, that it serves exactly what
// WriteStandInConfig wrote, from the file StandInConfigEnv names or from
// the converter's output for the profile NVMLConfigEnv names (a script
// here that prints the same file), and that it refuses to start without
// either or when the converter fails.
func TestNVMLStandInServesConfig(t *testing.T) {
	cc, err := exec.LookPath("cc")
	if err != nil {
		overlaytest.Missing(t, "no C compiler (cc): the stand-in is C")
	}
	p := NVMLStandIn()
	src, out := t.TempDir(), t.TempDir()
	for to, from := range p.Files {
		data, err := os.ReadFile(strings.TrimPrefix(from, "deploy/e2e/programs/"))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(src, to), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range p.Steps {
		args := make([]string, len(s.Args))
		for i, a := range s.Args {
			args[i] = strings.ReplaceAll(a, "{out}", out)
		}
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Dir = src
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, b)
		}
	}
	check := filepath.Join(src, "check")
	if err := os.WriteFile(check+".c", []byte(standInCheck), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(cc, "-o", check, check+".c", "-ldl").CombinedOutput(); err != nil {
		t.Fatalf("cc check.c: %v\n%s", err, b)
	}
	config := filepath.Join(src, "stand-in.conf")
	if err := WriteStandInConfig(config, []byte(standInTestProfile)); err != nil {
		t.Fatal(err)
	}
	profile := filepath.Join(src, "profile.yaml")
	converter := filepath.Join(out, StandInConverter)
	script := "#!/bin/sh\n[ \"$1\" = '" + profile + "' ] || { echo \"converter: no profile $1\" >&2; exit 3; }\nexec cat '" + config + "'\n"
	if err := os.WriteFile(converter, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	library := filepath.Join(out, MockNVML)
	// run sets both variables (empty is unset to the stand-in; os/exec
	// keeps the last of a name), so the caller's own cannot leak in.
	run := func(flat, nvmlProfile string) (string, string) {
		cmd := exec.Command(check, library)
		cmd.Env = append(os.Environ(), StandInConfigEnv+"="+flat, NVMLConfigEnv+"="+nvmlProfile)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run() // the output says what failed
		return stdout.String(), stderr.String()
	}

	want := `driver 580.65.06 cuda 13000 gpus 4
0 00000000:CB:00.0 0000:CB:00.0 0:cb:0 0x233010DE 0x16C110DE mem 0 85899345920 cc 9.0 mig 0 0/0 max 7 minor 4 GPU-00000000-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
1 00000000:1A:00.0 0000:1A:00.0 0:1a:0 0x233010DE 0x16C110DE mem 0 85899345920 cc 9.0 mig 0 0/0 max 7 minor 1 ` + derivedUUID + ` NVIDIA H100 80GB HBM3
2 00000000:4A:00.0 0000:4A:00.0 0:4a:0 0x233010DE 0x16C110DE mem 0 85899345920 cc 9.0 mig 0 0/0 max 7 minor 2 GPU-22222222-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
3 00000000:8A:00.0 0000:8A:00.0 0:8a:0 0x233010DE 0x16C010DE mem 0 100000 cc 9.1 mig 3 9/9 max 0 minor 3 GPU-33333333-0000-0000-0000-000000000000 NVIDIA H100 80GB HBM3
shutdown 0, again 1
`
	for _, c := range []struct {
		name, flat, nvmlProfile, want, stderr string
	}{
		// The flat file wins over the profile, which would fail here.
		{"file", config, filepath.Join(src, "other.yaml"), want, ""},
		{"converter", "", profile, want, ""},
		{
			"failing converter", "", filepath.Join(src, "other.yaml"),
			"nvmlInit_v2: 999 Unknown Error\n",
			"converter: no profile " + filepath.Join(src, "other.yaml") + "\n" +
				"nvml stand-in: " + converter + " " + filepath.Join(src, "other.yaml") + ": exit status 3\n",
		},
		{
			"neither", "", "",
			"nvmlInit_v2: 12 NVML Shared Library Not Found\n",
			"nvml stand-in: neither " + StandInConfigEnv + " (a file of GPUs) nor " + NVMLConfigEnv + " (an nvml-mock profile) is set\n",
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, stderr := run(c.flat, c.nvmlProfile)
			if got != c.want || stderr != c.stderr {
				t.Errorf("the stand-in serves\n%s(stderr %q)\nwant\n%s(stderr %q)", got, stderr, c.want, c.stderr)
			}
		})
	}
}
