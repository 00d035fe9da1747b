package kwok_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/kubetest"
	"github.com/nvml-mock/nvml-mock-sysfs/deploy/e2e/profilefacts"
)

// benchNodesEnv lists the fleet sizes BenchmarkKWOK measures, separated by
// commas (make bench KWOK_BENCH_NODES=100,500,1000); unset, 100: a
// 1,000-node run takes minutes of this 2-core machine, shared.
const benchNodesEnv = "NVML_MOCK_SYSFS_KWOK_BENCH_NODES"

// schedulerFlags lift the scheduler's client rate limits (50/s, burst
// 100, by default), as scheduler_perf does: each DRA pod costs it a claim
// status write and a binding, and at the default the limit, not the
// scheduler, would be measured.
func schedulerFlags() map[string][]string {
	return map[string][]string{"kube-scheduler": {"--kube-api-qps", "5000", "--kube-api-burst", "5000"}}
}

// benchKind is one kind of claim the benchmark schedules pods of, and
// the kind asking for nothing aligned it is measured against (its ratio).
type benchKind struct {
	name, against string
	// claim is pod i's claim spec and node selector.
	claim func(i int) (resourcev1.ResourceClaimSpec, map[string]string)
	// capacity is how many such pods the fleet holds at once: the
	// benchmark schedules as many as there are nodes, or this many.
	capacity int
}

// BenchmarkKWOK measures a KWOK fleet of each size (benchNodesEnv) on the
// real control plane: the time to publish every node's slices
// (publishSlices), kube-apiserver's and etcd's memory, and the
// scheduler's pods per second for each kind of claim, beside the same
// claims without their alignment (a ratio). Each size is measured once,
// whatever b.N: a fleet is minutes to build.
func BenchmarkKWOK(b *testing.B) {
	sizes := []int{100}
	if s := os.Getenv(benchNodesEnv); s != "" {
		sizes = nil
		for _, f := range strings.Split(s, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				b.Fatalf("%s=%q: want sizes such as 100,500,1000", benchNodesEnv, s)
			}
			sizes = append(sizes, n)
		}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) { benchFleet(b, n) })
	}
}

func benchFleet(b *testing.B, n int) {
	f := startFleet(b, n, kubetest.Options{Flags: schedulerFlags()})
	began := time.Now()
	names := make([]string, len(f.nodes))
	for i, node := range f.nodes {
		names[i] = node.Name
	}
	f.publishSlices(b, names)
	publish := time.Since(began)
	f.createClasses(b)
	f.createNamespace(b, namespace)
	rssAfterPublish := map[string]memory{}
	for _, name := range []string{"kube-apiserver", "etcd"} {
		rssAfterPublish[name] = f.memory(b, name)
	}

	results := map[string]float64{}
	counts := map[string]int{}
	for _, k := range f.benchKinds() {
		counts[k.name] = min(n, k.capacity)
		results[k.name] = f.schedule(b, k, counts[k.name])
	}
	b.ReportMetric(publish.Seconds(), "publish-s")
	b.ReportMetric(float64(n)/publish.Seconds(), "nodes-published/s")
	for _, name := range []string{"kube-apiserver", "etcd"} {
		m := f.memory(b, name)
		b.ReportMetric(rssAfterPublish[name].rss, name+"-RSS-MiB")
		b.ReportMetric(m.hwm, name+"-HWM-MiB")
	}
	var lines []string
	for _, k := range f.benchKinds() {
		b.ReportMetric(results[k.name], "pods/s-"+k.name)
		line := fmt.Sprintf("%-15s %5d pods %7.1f pods/s", k.name, counts[k.name], results[k.name])
		if k.against != "" {
			ratio := results[k.name] / results[k.against]
			b.ReportMetric(ratio, k.name+"/"+k.against)
			line += fmt.Sprintf("  %.2f of %s", ratio, k.against)
		}
		lines = append(lines, line)
	}
	b.Logf("%d KWOK nodes: slices published in %s; kube-apiserver RSS %.0f MiB after publishing, etcd %.0f MiB\n%s",
		n, publish.Round(time.Millisecond), rssAfterPublish["kube-apiserver"].rss, rssAfterPublish["etcd"].rss, strings.Join(lines, "\n"))
}

// benchKinds are the kinds the benchmark measures: one GPU of any kind
// (the baseline, nothing aligned), one GPU by product (CEL), a whole root
// (matchAttribute pcieRoot) and the same GPUs of the same profile with
// no matchAttribute. Pod i by product asks for node i's product (so the
// products' pods fit as the profiles are spread); pod i of the root kinds the i-th whole root of the fleet, node by
// node, as many as there are (a fleet whose whole roots all fill).
func (f *fleet) benchKinds() []benchKind {
	var products []string     // node i's first GPU's
	var roots []*fleetProfile // one per whole root of the fleet
	gpus := 0
	for _, node := range f.nodes {
		bound := node.profile.facts.NVIDIABound()
		gpus += len(bound)
		if len(bound) > 0 {
			products = append(products, bound[0].Name)
		}
		if _, _, k, ok := wholeRoot(node.profile.facts); ok {
			for _, g := range node.profile.facts.NVIDIABound() {
				// A root of the largest size, counted at its first GPU.
				if rootSize(node.profile.facts, g.Root) == k && firstOnRoot(node.profile.facts, g) {
					roots = append(roots, node.profile)
				}
			}
		}
	}
	spec := func(r resourcev1.DeviceRequest, c []resourcev1.DeviceConstraint) resourcev1.ResourceClaimSpec {
		return resourcev1.ResourceClaimSpec{Devices: resourcev1.DeviceClaim{Requests: []resourcev1.DeviceRequest{r}, Constraints: c}}
	}
	root := func(aligned bool) func(int) (resourcev1.ResourceClaimSpec, map[string]string) {
		return func(i int) (resourcev1.ResourceClaimSpec, map[string]string) {
			p := roots[i]
			_, product, k, _ := wholeRoot(p.facts)
			var c []resourcev1.DeviceConstraint
			if aligned {
				c = onOneRoot()
			}
			return spec(gpuRequest("gpus", k, product), c), map[string]string{profileLabel: p.slug}
		}
	}
	return []benchKind{
		{name: "one-gpu", capacity: gpus, claim: func(int) (resourcev1.ResourceClaimSpec, map[string]string) {
			return spec(gpuRequest("gpu", 1, ""), nil), nil
		}},
		{name: "product", against: "one-gpu", capacity: len(products), claim: func(i int) (resourcev1.ResourceClaimSpec, map[string]string) {
			return spec(gpuRequest("gpu", 1, products[i]), nil), nil
		}},
		{name: "root-unaligned", capacity: len(roots), claim: root(false)},
		{name: "whole-root", against: "root-unaligned", capacity: len(roots), claim: root(true)},
	}
}

// firstOnRoot is whether g is the first nvidia-bound GPU of its root.
func firstOnRoot(p *profilefacts.Profile, g profilefacts.GPU) bool {
	for _, o := range p.NVIDIABound() {
		if o.Root == g.Root {
			return o.BusID == g.BusID
		}
	}
	return false
}

// schedule creates the claims of pods pods of kind k (not timed), then the
// pods, and returns the pods bound per second, from the first pod's
// creation to the last binding; it then deletes them and their claims and
// waits until they are gone, so the next kind finds every device free.
func (f *fleet) schedule(b *testing.B, k benchKind, pods int) float64 {
	b.Helper()
	ctx := context.Background()
	f.parallel(b, pods, func(i int) error {
		spec, _ := k.claim(i)
		_, err := f.client.ResourceV1().ResourceClaims(namespace).Create(ctx, &resourcev1.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", k.name, i), Namespace: namespace}, Spec: spec}, metav1.CreateOptions{})
		return err
	})
	bound := map[string]bool{}
	// watch lists the bound pods and watches from there: the API server
	// may end a watch at any time, and the count goes on from a list.
	watchBound := func() watch.Interface {
		list, err := f.client.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{})
		if err != nil {
			b.Fatal(err)
		}
		for _, p := range list.Items {
			if p.Spec.NodeName != "" {
				bound[p.Name] = true
			}
		}
		w, err := f.client.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{ResourceVersion: list.ResourceVersion})
		if err != nil {
			b.Fatal(err)
		}
		return w
	}
	w := watchBound()
	defer func() { w.Stop() }()
	began := time.Now()
	// The pods are created while the watch counts their bindings: how
	// long the creations took is said beside the figure, so a client
	// that lags the scheduler shows.
	type creation struct {
		took time.Duration
		err  error
	}
	created := make(chan creation, 1)
	go func() {
		err := parallel(pods, func(i int) error {
			name := fmt.Sprintf("%s-%d", k.name, i)
			_, selector := k.claim(i)
			_, err := f.client.CoreV1().Pods(namespace).Create(ctx, claimPod(namespace, name, selector, "", name), metav1.CreateOptions{})
			return err
		})
		created <- creation{time.Since(began), err}
	}()
	timeout := time.After(10 * time.Minute)
	var done *creation
	waiting := created // nil once the creations ended
	for len(bound) < pods {
		select {
		case c := <-waiting:
			if c.err != nil {
				b.Fatal(c.err)
			}
			done, waiting = &c, nil
		case e, ok := <-w.ResultChan():
			if !ok {
				w = watchBound()
				continue
			}
			if p, isPod := e.Object.(*corev1.Pod); isPod && e.Type != watch.Deleted && p.Spec.NodeName != "" {
				bound[p.Name] = true
			}
		case <-timeout:
			b.Fatalf("%s: %d of %d pods bound within 10 minutes", k.name, len(bound), pods)
		}
	}
	took := time.Since(began)
	if done == nil {
		c := <-created
		if c.err != nil {
			b.Fatal(c.err)
		}
		done = &c
	}
	b.Logf("%s: %d pods bound in %s (created in %s)", k.name, pods, took.Round(time.Millisecond), done.took.Round(time.Millisecond))
	f.clear(b)
	return float64(pods) / took.Seconds()
}

// clear deletes the namespace's pods and claims and waits until both are
// gone (KWOK's pod-delete stage removes a deleted pod).
func (f *fleet) clear(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	all := metav1.ListOptions{}
	if err := f.client.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		b.Fatal(err)
	}
	if err := f.client.ResourceV1().ResourceClaims(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, all); err != nil {
		b.Fatal(err)
	}
	f.c.Wait(b, "the pods and claims deleted", 5*time.Minute, func() error {
		pods, err := f.client.CoreV1().Pods(namespace).List(ctx, all)
		if err != nil {
			return err
		}
		claims, err := f.client.ResourceV1().ResourceClaims(namespace).List(ctx, all)
		if err != nil {
			return err
		}
		if len(pods.Items)+len(claims.Items) > 0 {
			return fmt.Errorf("%d pods and %d claims left", len(pods.Items), len(claims.Items))
		}
		return nil
	})
}

// memory is a process's resident set now and at its peak, in MiB.
type memory struct{ rss, hwm float64 }

// memory reads a component's VmRSS and VmHWM from /proc/<pid>/status.
func (f *fleet) memory(b *testing.B, name string) memory {
	b.Helper()
	p := f.c.Process(name)
	if p == nil {
		b.Fatalf("no %s in the cluster", name)
	}
	file, err := os.Open(filepath.Join("/proc", strconv.Itoa(p.PID), "status"))
	if err != nil {
		b.Fatal(err)
	}
	defer file.Close()
	var m memory
	s := bufio.NewScanner(file)
	for s.Scan() {
		key, value, _ := strings.Cut(s.Text(), ":")
		fields := strings.Fields(value)
		if len(fields) != 2 || fields[1] != "kB" {
			continue
		}
		kb, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		switch key {
		case "VmRSS":
			m.rss = kb / 1024
		case "VmHWM":
			m.hwm = kb / 1024
		}
	}
	if m.rss == 0 || m.hwm == 0 {
		b.Fatalf("%s (pid %d): no VmRSS or VmHWM in its status", name, p.PID)
	}
	return m
}
