package containerdtest

import (
	"debug/elf"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/hosttest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/linkscan"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/ociimage"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/overlaytest"
)

// pauseProgram is the sandbox's program, built static from the
// repository: testdata keeps it out of the product's packages.
const pauseProgram = "./deploy/e2e/containerdtest/testdata/pause"

// pauseImage is the sandbox image: the pause program alone.
func pauseImage(t testing.TB) ociimage.Image {
	t.Helper()
	return ProgramImage(t, PauseImage, pauseProgram, "/pause")
}

// ProgramImage is an image named name of one static program of the
// repository (a package path below it), at path, its entrypoint.
func ProgramImage(t testing.TB, name, program, path string) ociimage.Image {
	t.Helper()
	return ociimage.Image{
		Name:       name,
		Files:      []ociimage.File{{Path: path, Source: hosttest.BuildStatic(t, program), Mode: 0o755}},
		Entrypoint: []string{path},
	}
}

// The real consumers (GFD, nfd-worker, the DRA driver's programs) are cgo
// programs, linked against the host's glibc. Their image holds only the
// usual links into /usr and empty mountpoints: a container gets the host's
// /usr read-only, the program's build and the mock NVML read-only from the
// consumers cache (ConsumerMounts), as the podman test's lspci does. A CRI
// container and a Kubernetes pod (hostPath volumes) mount the same.
const (
	// ConsumerImage is the consumer image's name. A kubelet asks for it
	// as it is (a localhost/ name is not docker.io's).
	ConsumerImage = "localhost/nvml-mock-sysfs/consumer:test"
	// InConsumerBuild is where a consumer's build directory is mounted.
	InConsumerBuild = "/opt/consumers"
	// InMockNVML is where the mock NVML's build directory is mounted.
	InMockNVML = "/opt/mock-nvml"
	// InConsumerOutput is a directory a consumer may write.
	InConsumerOutput = "/out"
)

// LinkedImage is an image of files (cgo programs and shared libraries of
// the host's build) with every library they link, as ldd resolves it on
// the host, at the path ldd names: for a pod whose manifest mounts nothing
// of ours, such as a stock chart's (which ConsumerBaseImage's host /usr
// would need). Env is the image's.
func LinkedImage(t testing.TB, name string, files []ociimage.File, env []string) ociimage.Image {
	t.Helper()
	img := ociimage.Image{Name: name, Env: env}
	have := map[string]bool{}
	add := func(f ociimage.File) {
		if !have[f.Path] {
			have[f.Path] = true
			img.Files = append(img.Files, f)
		}
	}
	for _, f := range files {
		add(f)
		if f.Source == "" || !dynamicELF(t, f.Source) {
			continue
		}
		out, err := exec.Command("ldd", f.Source).Output()
		require.NoError(t, err, "ldd %s", f.Source)
		for _, line := range strings.Split(string(out), "\n") {
			// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
			// "/lib64/ld-linux-x86-64.so.2 (0x...)"; the vDSO has no file.
			fields := strings.Fields(line)
			if len(fields) >= 3 && fields[1] == "=>" {
				fields = fields[2:]
			}
			if len(fields) == 0 || !strings.HasPrefix(fields[0], "/") {
				continue
			}
			real, err := filepath.EvalSymlinks(fields[0])
			require.NoError(t, err)
			add(ociimage.File{Path: fields[0], Source: real, Mode: 0o755})
		}
	}
	return img
}

// dynamicELF reports whether file is an ELF object with a dynamic
// section, whose libraries ldd lists (a data file or a static program has
// none).
func dynamicELF(t testing.TB, file string) bool {
	t.Helper()
	f, err := elf.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	return f.Section(".dynamic") != nil
}

// ConsumerBaseImage is the consumer image.
func ConsumerBaseImage() ociimage.Image {
	img := ociimage.Image{Name: ConsumerImage}
	for _, dir := range []string{"bin", "lib", "lib64", "sbin"} {
		img.Files = append(img.Files, ociimage.File{Path: "/" + dir, Mode: os.ModeSymlink, Link: "usr/" + dir})
	}
	for _, dir := range []string{"/usr", "/tmp", InConsumerBuild, InMockNVML, InConsumerOutput} {
		img.Files = append(img.Files, ociimage.File{Path: dir, Mode: os.ModeDir | 0o755})
	}
	return img
}

// ConsumerMounts are the read-only mounts a consumer container needs: the
// host's /usr, the consumer's build directory and the mock NVML's.
func ConsumerMounts(buildDir, mockNVML string) []Mount {
	return []Mount{
		{HostPath: "/usr", ContainerPath: "/usr", ReadOnly: true},
		{HostPath: buildDir, ContainerPath: InConsumerBuild, ReadOnly: true},
		{HostPath: mockNVML, ContainerPath: InMockNVML, ReadOnly: true},
	}
}

// dockerfile is the DaemonSet image's recipe, below the repository.
const dockerfile = "deploy/kubernetes/Dockerfile"

// BinaryImage is the image deploy/kubernetes/Dockerfile builds, named
// name, with bin as the binary it copies: the Dockerfile is read, so the
// recipe has one home. It may hold only FROM scratch, one COPY of the
// binary and an exec-form ENTRYPOINT (TestDockerfileIsScratch pins that).
func BinaryImage(t testing.TB, name, bin string) ociimage.Image {
	t.Helper()
	file := filepath.Join(overlaytest.Repo(t), dockerfile)
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	img := ociimage.Image{Name: name}
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		instruction, rest, _ := strings.Cut(line, " ")
		switch instruction {
		case "FROM":
			require.Equal(t, "scratch", rest, "%s: %s", dockerfile, line)
		case "COPY":
			src, dst, ok := strings.Cut(rest, " ")
			require.True(t, ok && src == "bin/nvml-mock-sysfs", "%s: %s: want COPY bin/nvml-mock-sysfs DEST", dockerfile, line)
			img.Files = append(img.Files, ociimage.File{Path: dst, Source: bin, Mode: 0o755})
		case "ENTRYPOINT":
			require.NoError(t, json.Unmarshal([]byte(rest), &img.Entrypoint), "%s: %s", dockerfile, line)
		default:
			t.Fatalf("%s: %s: only FROM, COPY and ENTRYPOINT are built here", dockerfile, line)
		}
	}
	require.Len(t, img.Files, 1, dockerfile)
	return img
}

// NormalizedImage is the reference a kubelet asks containerd for when a
// pod names image: a name without a registry is docker.io's, and one
// without a path is library/'s. An image imported under any other name is
// not found, and the kubelet tries a registry.
func NormalizedImage(image string) string {
	first, _, hasSlash := strings.Cut(image, "/")
	switch {
	case !hasSlash:
		return "docker.io/library/" + image
	case !strings.ContainsAny(first, ".:") && first != "localhost":
		return "docker.io/" + image
	}
	return image
}

// ReaderImage holds deploy/e2e/containerdtest/testdata/reader alone: a served
// container that scans /sys/bus/pci/devices in a loop while the tree is
// re-rendered, and prints ReaderTotals when stopped (SIGTERM).
const ReaderImage = "localhost/nvml-mock-sysfs/reader:test"

// readerProgram is the reader's package, below the repository.
const readerProgram = "./deploy/e2e/containerdtest/testdata/reader"

// ReaderBaseImage is the reader's image.
func ReaderBaseImage(t testing.TB) ociimage.Image {
	t.Helper()
	return ProgramImage(t, ReaderImage, readerProgram, "/reader")
}

// ReaderTotals is the reader's report: its totals over every scan, and
// the entry counts of each distinct whole tree it saw, in order.
type ReaderTotals struct {
	linkscan.Totals
	Views []int `json:"views"`
}

// ReaderView is the reader's last progress line of one view: how many
// entries the tree has and how many whole scans of it the reader made in a
// row.
type ReaderView struct{ Entries, Scans int }

// ParseReaderViews reads the reader's progress lines (its progressLine),
// one view each, in order.
func ParseReaderViews(out string) ([]ReaderView, error) {
	var views []ReaderView
	for _, m := range regexp.MustCompile(`(?m)^view (\d+): (\d+) entries, (\d+) whole scans$`).FindAllStringSubmatch(out, -1) {
		n := make([]int, 3)
		for i := range n {
			n[i], _ = strconv.Atoi(m[i+1])
		}
		switch view := n[0]; {
		case view == len(views):
			views[view-1] = ReaderView{n[1], n[2]}
		case view == len(views)+1:
			views = append(views, ReaderView{n[1], n[2]})
		default:
			return views, fmt.Errorf("the reader's progress: view %d after %d views", view, len(views))
		}
	}
	return views, nil
}

// ParseReaderTotals reads the report, the last line of the reader's
// output.
func ParseReaderTotals(out string) (ReaderTotals, error) {
	var totals ReaderTotals
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &totals); err != nil {
		return totals, fmt.Errorf("the reader's report: %w in %q", err, out)
	}
	return totals, nil
}
