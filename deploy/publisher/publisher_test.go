package publisher

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/nvml-mock/nvml-mock-sysfs/deploy/fleet"
	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

const (
	fleetNamespace = "nvml-mock"
	fleetName      = "nvml-mock-sysfs-fleet"
	kwokLabel      = "type"
	profileLabel   = "nvml-mock/profile"
	// wait bounds each wait for the publisher: a controller's start takes
	// about a second.
	wait = 20 * time.Second
)

// fakeAPI is client-go's fake clientset made to behave as the API server
// does where the ResourceSlice controller relies on it: names completed
// from generateName, integer resource versions, and the field selectors
// (spec.nodeName, spec.driver) and label selectors (the publisher's mark)
// of lists and watches applied, without which each node's controller
// would see, and delete, every other node's pool, and every slice of its
// own that another wrote.
func fakeAPI(t *testing.T, objs ...runtime.Object) *fake.Clientset {
	t.Helper()
	c := fake.NewSimpleClientset(objs...)
	var rv atomic.Int64
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*resourcev1.ResourceSlice)
		n := rv.Add(1)
		if s.Name == "" {
			s.Name = fmt.Sprintf("%s%05d", s.GenerateName, n)
		}
		s.UID = types.UID(fmt.Sprintf("uid-%d", n))
		s.ResourceVersion = fmt.Sprint(n)
		return false, nil, nil
	})
	c.PrependReactor("update", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.UpdateAction).GetObject().(*resourcev1.ResourceSlice)
		s.ResourceVersion = fmt.Sprint(rv.Add(1))
		return false, nil, nil
	})
	gvr := resourcev1.SchemeGroupVersion.WithResource("resourceslices")
	c.PrependReactor("list", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		obj, err := c.Tracker().List(gvr, resourcev1.SchemeGroupVersion.WithKind("ResourceSlice"), "")
		if err != nil {
			return true, nil, err
		}
		list := obj.(*resourcev1.ResourceSliceList)
		sel := a.(k8stesting.ListAction).GetListRestrictions()
		var kept []resourcev1.ResourceSlice
		for _, s := range list.Items {
			if sel.Fields.Matches(sliceFields(&s)) && sel.Labels.Matches(labels.Set(s.Labels)) {
				kept = append(kept, s)
			}
		}
		list.Items = kept
		list.ResourceVersion = fmt.Sprint(rv.Load())
		return true, list, nil
	})
	c.PrependWatchReactor("resourceslices", func(a k8stesting.Action) (bool, watch.Interface, error) {
		wa := a.(k8stesting.WatchActionImpl)
		w, err := c.Tracker().Watch(gvr, "", wa.ListOptions)
		if err != nil {
			return true, nil, err
		}
		sel := wa.GetWatchRestrictions()
		return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
			s, ok := ev.Object.(*resourcev1.ResourceSlice)
			return ev, !ok || (sel.Fields.Matches(sliceFields(s)) && sel.Labels.Matches(labels.Set(s.Labels)))
		}), nil
	})
	return c
}

func sliceFields(s *resourcev1.ResourceSlice) fields.Set {
	node := ""
	if s.Spec.NodeName != nil {
		node = *s.Spec.NodeName
	}
	return fields.Set{"metadata.name": s.Name, resourcev1.ResourceSliceSelectorNodeName: node, resourcev1.ResourceSliceSelectorDriver: s.Spec.Driver}
}

// node is a Node without KWOK's annotation, as a real node is.
func node(name string, labels map[string]string) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("node-" + name), Labels: labels}}
}

// kwokNode is a Node KWOK manages, as its documentation makes them.
func kwokNode(name string, labels map[string]string) *corev1.Node {
	n := node(name, labels)
	n.Annotations = map[string]string{KWOKNodeAnnotation: KWOKNodeValue}
	return n
}

// builtinText is a built-in's profile as a fleet ConfigMap key holds one.
func builtinText(t *testing.T, name string) string {
	t.Helper()
	_, data, err := resourceslices.ReadProfile(name)
	require.NoError(t, err)
	return string(data)
}

func fleetConfigMap(data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: fleetNamespace, Name: fleetName}, Data: data}
}

// run is a publisher of the nodes labelled type=kwok on c, stopped when
// the test ends; log holds its log.
type run struct {
	c   *fake.Clientset
	p   *Publisher
	log *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func start(t *testing.T, objs ...runtime.Object) *run {
	t.Helper()
	return startOn(t, fakeAPI(t, objs...))
}

// startOn is start on a fake API of the test's.
func startOn(t *testing.T, c *fake.Clientset) *run {
	t.Helper()
	r := &run{c: c, log: &syncBuffer{}}
	var err error
	r.p, err = New(Options{
		Client: r.c, Nodes: labels.SelectorFromSet(labels.Set{kwokLabel: "kwok"}),
		Fleet:  types.NamespacedName{Namespace: fleetNamespace, Name: fleetName},
		Listen: "127.0.0.1:0", Logger: slog.New(slog.NewTextHandler(r.log, nil)),
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return r
}

// slicesOf are the slices published on node.
func (r *run) slicesOf(t *testing.T, node string) []resourcev1.ResourceSlice {
	t.Helper()
	list, err := r.c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector(resourcev1.ResourceSliceSelectorNodeName, node).String()})
	require.NoError(t, err)
	// Driver by driver, as resourceslices.ForNode gives them: the API
	// server lists by name, which the controller generates.
	slices.SortStableFunc(list.Items, func(a, b resourcev1.ResourceSlice) int {
		return cmp.Compare(resourceslices.DriverOrder(a.Spec.Driver), resourceslices.DriverOrder(b.Spec.Driver))
	})
	return list.Items
}

// planned are the slices resourceslices gives node for the built-in
// profile name.
func planned(t *testing.T, name, node string) []resourcev1.ResourceSlice {
	t.Helper()
	source, data, err := resourceslices.ReadProfile(name)
	require.NoError(t, err)
	want, err := resourceslices.ForNode(source, data, node)
	require.NoError(t, err)
	require.NotEmpty(t, want)
	return want
}

// foreignPrefix names the slices the tests make as someone else's, with
// no mark: they are no part of what the publisher published.
const foreignPrefix = "foreign-"

// samePublished says how the slices published on node (but the foreign
// ones) differ from want, or "" when they are want's, owned by the Node
// and marked as the publisher's.
func (r *run) samePublished(t *testing.T, node string, want []resourcev1.ResourceSlice) string {
	got := slices.DeleteFunc(r.slicesOf(t, node), func(s resourcev1.ResourceSlice) bool {
		return strings.HasPrefix(s.Name, foreignPrefix)
	})
	if len(got) != len(want) {
		return fmt.Sprintf("%d slices on %s, want %d", len(got), node, len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		switch {
		case g.GenerateName != w.GenerateName:
			return fmt.Sprintf("%s: generateName %q, want %q", node, g.GenerateName, w.GenerateName)
		case !apiequality.Semantic.DeepEqual(g.Spec, w.Spec):
			return fmt.Sprintf("%s: slice %s's spec is not resourceslices' (%d devices, want %d)", node, g.Name, len(g.Spec.Devices), len(w.Spec.Devices))
		case len(g.OwnerReferences) != 1 || g.OwnerReferences[0].Kind != "Node" || g.OwnerReferences[0].Name != node ||
			g.OwnerReferences[0].UID != types.UID("node-"+node) || g.OwnerReferences[0].Controller == nil || !*g.OwnerReferences[0].Controller:
			return fmt.Sprintf("%s: slice %s's owners %+v, want the Node alone, as controller", node, g.Name, g.OwnerReferences)
		case g.Labels[OwnLabel] != OwnValue:
			return fmt.Sprintf("%s: slice %s's labels %v lack the mark %s=%s", node, g.Name, g.Labels, OwnLabel, OwnValue)
		}
	}
	return ""
}

// eventually waits until cond says nothing is wrong, or fails with what
// it last said: the reason, not only that the wait ran out.
func (r *run) eventually(t *testing.T, what string, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for {
		last := cond()
		if last == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s\nlog:\n%s", what, last, r.log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// planned says whether the planner has passed over node: "" once it has.
func (r *run) planned(node string) string {
	r.p.mu.Lock()
	defer r.p.mu.Unlock()
	if _, ok := r.p.nodes[node]; !ok {
		return "the planner has not seen " + node
	}
	return ""
}

func (r *run) updateFleet(t *testing.T, data map[string]string) {
	t.Helper()
	_, err := r.c.CoreV1().ConfigMaps(fleetNamespace).Update(context.Background(), fleetConfigMap(data), metav1.UpdateOptions{})
	require.NoError(t, err)
}

// TestPublisher: each selected node carries resourceslices' slices for the
// profile the map gives it, owned by the Node; a ConfigMap edit updates
// them in place; a node relabelled out of the selector, or deleted, has
// them withdrawn; a node the selector does not name has none.
func TestPublisher(t *testing.T) {
	fleetYAML := "nodes: {kwok-a: t4-vm}\nlabels:\n  - match: {" + profileLabel + ": gb200}\n    profile: gb200.yaml\ndefault: dgx-a100\n"
	data := map[string]string{fleet.ConfigMapKey: fleetYAML, "gb200.yaml": builtinText(t, "gb200-tray")}
	r := start(t,
		fleetConfigMap(data),
		kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}),
		kwokNode("kwok-b", map[string]string{kwokLabel: "kwok", profileLabel: "gb200"}),
		kwokNode("kwok-c", map[string]string{kwokLabel: "kwok"}),
		node("real-d", nil),
	)
	for node, profile := range map[string]string{"kwok-a": "t4-vm", "kwok-b": "gb200-tray", "kwok-c": "dgx-a100"} {
		want := planned(t, profile, node)
		r.eventually(t, node+" published", func() string { return r.samePublished(t, node, want) })
	}
	require.Empty(t, r.slicesOf(t, "real-d"), "a node the selector does not name")
	r.eventually(t, "ready", func() string { return errString(r.p.Ready()) })

	// A re-profile through the ConfigMap: kwok-a's slice is updated in
	// place, under its name.
	before := r.slicesOf(t, "kwok-a")[0]
	data[fleet.ConfigMapKey] = strings.Replace(fleetYAML, "kwok-a: t4-vm", "kwok-a: hgx-h100", 1)
	r.updateFleet(t, data)
	want := planned(t, "hgx-h100", "kwok-a")
	r.eventually(t, "kwok-a re-profiled", func() string { return r.samePublished(t, "kwok-a", want) })
	after := r.slicesOf(t, "kwok-a")[0]
	require.Equal(t, before.Name, after.Name, "updated in place")
	t.Logf("kwok-a's pool generation after the re-profile: %d (before: %d)", after.Spec.Pool.Generation, before.Spec.Pool.Generation)

	// kwok-a leaves the selector; kwok-c is deleted.
	a, err := r.c.CoreV1().Nodes().Get(context.Background(), "kwok-a", metav1.GetOptions{})
	require.NoError(t, err)
	delete(a.Labels, kwokLabel)
	_, err = r.c.CoreV1().Nodes().Update(context.Background(), a, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.NoError(t, r.c.CoreV1().Nodes().Delete(context.Background(), "kwok-c", metav1.DeleteOptions{}))
	for _, node := range []string{"kwok-a", "kwok-c"} {
		r.eventually(t, node+" withdrawn", func() string {
			if n := len(r.slicesOf(t, node)); n > 0 {
				return fmt.Sprintf("%d slices left", n)
			}
			return ""
		})
	}
	require.Empty(t, r.samePublished(t, "kwok-b", planned(t, "gb200-tray", "kwok-b")), "the other nodes keep theirs")
	require.Contains(t, r.log.String(), `msg=withdrawn node=kwok-a why="no longer selected"`)
	require.Contains(t, r.log.String(), `msg=withdrawn node=kwok-c why=deleted`)
}

// TestPublisherWithdrawsAnEarlierPublishersSlices: a node's slices of a
// driver its profile gives nothing, left by an earlier publisher (given
// another map before a restart), are withdrawn; the node then carries its
// profile's alone. Without the withdrawal the old dra.net slice stayed
// beside t4-vm's GPUs (the wing's TestPublisher, seen red so).
//
// The earlier publisher's slice is known by the mark: another's slice of
// the same driver on the node, unmarked, stays (seen red with the mark's
// selector taken from deleteSlices).
func TestPublisherWithdrawsAnEarlierPublishersSlices(t *testing.T) {
	leftover := slice("kwok-a-dra.net-old", resourceslices.DRANetDriver, "kwok-a")
	leftover.Labels = map[string]string{OwnLabel: OwnValue}
	foreign := slice(foreignPrefix+"dra.net", resourceslices.DRANetDriver, "kwok-a")
	r := start(t,
		fleetConfigMap(map[string]string{fleet.ConfigMapKey: "nodes: {kwok-a: t4-vm}\n"}),
		kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}),
		leftover, foreign,
	)
	want := planned(t, "t4-vm", "kwok-a")
	r.eventually(t, "kwok-a's profile's slices alone", func() string { return r.samePublished(t, "kwok-a", want) })
	r.requireUntouched(t, foreign)
}

// slice is a slice of driver on node, one of a pool of one, in the pool
// the drivers name for the node.
func slice(name, driver, node string) *resourcev1.ResourceSlice {
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name, UID: types.UID("uid-" + name), ResourceVersion: "1"},
		Spec: resourcev1.ResourceSliceSpec{Driver: driver, NodeName: ptr.To(node),
			Pool:    resourcev1.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1},
			Devices: []resourcev1.Device{{Name: "gpu-0"}}},
	}
}

// requireUntouched fails unless s is in the API as the test made it: not
// updated (its resource version) and not deleted.
func (r *run) requireUntouched(t *testing.T, s *resourcev1.ResourceSlice) {
	t.Helper()
	got, err := r.c.ResourceV1().ResourceSlices().Get(context.Background(), s.Name, metav1.GetOptions{})
	require.NoError(t, err, "%s, another's slice, was deleted\nlog:\n%s", s.Name, r.log)
	require.Equal(t, s.UID, got.UID, "%s was made again", s.Name)
	require.Equal(t, s.ResourceVersion, got.ResourceVersion, "%s, another's slice, was updated\nlog:\n%s", s.Name, r.log)
	require.Empty(t, got.Labels[OwnLabel], "%s was marked", s.Name)
}

// TestPublisherLeavesAnothersSlices: on a KWOK node carrying another's
// slices, of the driver the publisher publishes (in the pool it publishes,
// which the ResourceSlice controller would take for an obsolete slice of
// its own) and of one it does not publish there, the publisher publishes
// its own beside them, and withdraws its own alone when the node leaves
// the selector: another's are never updated or deleted, on the first start
// or on withdrawal. Seen red with the controller given the plain client
// (the GPU slice deleted as obsolete) and with deleteSlices' list and
// check of the mark taken out (the dra.net slice deleted as an earlier
// publisher's).
func TestPublisherLeavesAnothersSlices(t *testing.T) {
	gpu := slice(foreignPrefix+"gpu", resourceslices.NVIDIAGPUDriver, "kwok-a")
	hca := slice(foreignPrefix+"dra.net", resourceslices.DRANetDriver, "kwok-a")
	r := start(t,
		fleetConfigMap(map[string]string{fleet.ConfigMapKey: "nodes: {kwok-a: t4-vm}\n"}),
		kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}),
		gpu, hca,
	)
	// The event: the controller's first sync of the pool, which deletes
	// the slices it takes for obsolete before it creates its own.
	r.eventually(t, "the publisher's slice in the API", func() string {
		for _, s := range r.slicesOf(t, "kwok-a") {
			if !strings.HasPrefix(s.Name, foreignPrefix) {
				return ""
			}
		}
		return "none yet"
	})
	r.requireUntouched(t, gpu)
	r.requireUntouched(t, hca)
	want := planned(t, "t4-vm", "kwok-a")
	r.eventually(t, "published beside another's", func() string { return r.samePublished(t, "kwok-a", want) })

	a, err := r.c.CoreV1().Nodes().Get(context.Background(), "kwok-a", metav1.GetOptions{})
	require.NoError(t, err)
	delete(a.Labels, kwokLabel)
	_, err = r.c.CoreV1().Nodes().Update(context.Background(), a, metav1.UpdateOptions{})
	require.NoError(t, err)
	r.eventually(t, "the publisher's withdrawn", func() string { return r.samePublished(t, "kwok-a", nil) })
	r.requireUntouched(t, gpu)
	r.requireUntouched(t, hca)
}

// TestPublisherRefusesARealNode: a Node the selector names that is not
// KWOK's (a real node, which runs its own drivers) gets nothing, and its
// slices, another's, stay untouched; the refusal is one log line, however
// often the node is planned again. A KWOK node that loses KWOK's
// annotation has its slices withdrawn. Seen red with isKWOKNode always
// true (nothing refused: the real node got slices beside the other's).
func TestPublisherRefusesARealNode(t *testing.T) {
	fleetYAML := "default: t4-vm\n"
	theirs := slice(foreignPrefix+"gpu", resourceslices.NVIDIAGPUDriver, "real-r")
	r := start(t,
		fleetConfigMap(map[string]string{fleet.ConfigMapKey: fleetYAML}),
		node("real-r", map[string]string{kwokLabel: "kwok"}),
		kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}),
		theirs,
	)
	want := planned(t, "t4-vm", "kwok-a")
	r.eventually(t, "kwok-a published", func() string { return r.samePublished(t, "kwok-a", want) })
	refusal := "msg=\"refused: not a KWOK node, whatever the selector says\" node=real-r why=\"no annotation " + KWOKNodeAnnotation + "=" + KWOKNodeValue
	r.eventually(t, "real-r refused", func() string {
		if !strings.Contains(r.log.String(), refusal) {
			return "no refusal logged"
		}
		return ""
	})
	// Every node planned again, through a map that moves kwok-a: the
	// planner has passed over real-r once more when kwok-a is re-profiled.
	r.updateFleet(t, map[string]string{fleet.ConfigMapKey: fleetYAML + "nodes: {kwok-a: hgx-h100}\n"})
	r.eventually(t, "kwok-a re-profiled", func() string { return r.samePublished(t, "kwok-a", planned(t, "hgx-h100", "kwok-a")) })
	require.Equal(t, 1, strings.Count(r.log.String(), "node=real-r"), "one line of the real node:\n%s", r.log)
	require.Contains(t, r.log.String(), "level=WARN "+refusal)
	require.Empty(t, r.samePublished(t, "real-r", nil))
	r.requireUntouched(t, theirs)
	require.NoError(t, r.p.Ready(), "a refused node is no reason not to be ready")

	// kwok-a loses KWOK's annotation: its slices are withdrawn.
	a, err := r.c.CoreV1().Nodes().Get(context.Background(), "kwok-a", metav1.GetOptions{})
	require.NoError(t, err)
	a.Annotations = nil
	_, err = r.c.CoreV1().Nodes().Update(context.Background(), a, metav1.UpdateOptions{})
	require.NoError(t, err)
	r.eventually(t, "kwok-a withdrawn", func() string { return r.samePublished(t, "kwok-a", nil) })
	require.Contains(t, r.log.String(), `msg=withdrawn node=kwok-a why="no annotation `+KWOKNodeAnnotation)
}

// TestPublisherRefusesABadMap: a map that does not parse is one log line
// naming the ConfigMap's map, the field and the value, and /readyz's
// reason; the last good map's slices stay as they were, and a publisher
// that never had a good map publishes nothing.
func TestPublisherRefusesABadMap(t *testing.T) {
	bad := map[string]string{fleet.ConfigMapKey: "nodes: {kwok-a: t4-vm}\ndefault: dgx-a100\nlabels:\n  - match: {\"not a key\": x}\n    profile: t4-vm\n"}
	wantErr := "fleet map /namespaces/" + fleetNamespace + "/configmaps/" + fleetName + "/fleet.yaml: labels[0].match: value \"not a key\""

	t.Run("from the start", func(t *testing.T) {
		r := start(t, fleetConfigMap(bad), kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}))
		r.eventually(t, "refused", func() string {
			if err := r.p.Ready(); err == nil || !strings.Contains(err.Error(), wantErr) {
				return fmt.Sprintf("Ready: %v, want %s", err, wantErr)
			}
			return ""
		})
		// The event this window waits out: the planner's pass over kwok-a
		// with the map refused, which would start its publishing. Then
		// give a wrong publish the time it would take.
		r.eventually(t, "kwok-a planned", func() string { return r.planned("kwok-a") })
		time.Sleep(2 * time.Second)
		require.Empty(t, r.slicesOf(t, "kwok-a"))
		require.Equal(t, 1, strings.Count(r.log.String(), "level=ERROR"), r.log.String())
		require.Contains(t, r.log.String(), "nothing is published until it parses")
	})

	t.Run("after a good one", func(t *testing.T) {
		good := map[string]string{fleet.ConfigMapKey: "nodes: {kwok-a: t4-vm}\n"}
		r := start(t, fleetConfigMap(good), kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}))
		want := planned(t, "t4-vm", "kwok-a")
		r.eventually(t, "published", func() string { return r.samePublished(t, "kwok-a", want) })
		r.updateFleet(t, bad)
		r.eventually(t, "refused", func() string {
			if err := r.p.Ready(); err == nil || !strings.Contains(err.Error(), wantErr) {
				return fmt.Sprintf("Ready: %v, want %s", err, wantErr)
			}
			return ""
		})
		require.Empty(t, r.samePublished(t, "kwok-a", want), "the last good map's slices stay")
		require.Equal(t, 1, strings.Count(r.log.String(), "level=ERROR"), r.log.String())
		require.Contains(t, r.log.String(), "the last good map's slices stay published")
	})

	t.Run("a profile the ConfigMap lacks", func(t *testing.T) {
		m := map[string]string{fleet.ConfigMapKey: "nodes: {kwok-a: a100.yaml}\n"}
		r := start(t, fleetConfigMap(m), kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}))
		r.eventually(t, "refused", func() string {
			if err := r.p.Ready(); err == nil || !strings.Contains(err.Error(), "node kwok-a: fleet map /namespaces/"+fleetNamespace+"/configmaps/"+fleetName+"/fleet.yaml: nodes[kwok-a]: ConfigMap "+fleetNamespace+"/"+fleetName+" has no key a100.yaml") {
				return fmt.Sprintf("Ready: %v", err)
			}
			return ""
		})
		require.Empty(t, r.slicesOf(t, "kwok-a"))
	})
}

// TestPublisherNoMatch: a node a map without a default does not match
// carries nothing; matched later, it carries its profile's.
func TestPublisherNoMatch(t *testing.T) {
	m := map[string]string{fleet.ConfigMapKey: "nodes: {kwok-b: t4-vm}\n"}
	r := start(t, fleetConfigMap(m), kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}))
	r.eventually(t, "said", func() string {
		if !strings.Contains(r.log.String(), "the fleet map gives the node no profile") {
			return "not said"
		}
		return ""
	})
	require.Empty(t, r.slicesOf(t, "kwok-a"))
	require.NoError(t, r.p.Ready())
	m[fleet.ConfigMapKey] = "nodes: {kwok-a: t4-vm}\n"
	r.updateFleet(t, m)
	want := planned(t, "t4-vm", "kwok-a")
	r.eventually(t, "published", func() string { return r.samePublished(t, "kwok-a", want) })
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPublisherNotReadyWhileRefused: a publisher whose slices the API
// server refuses is not ready, and says why.
func TestPublisherNotReadyWhileRefused(t *testing.T) {
	m := map[string]string{fleet.ConfigMapKey: "default: t4-vm\n"}
	c := fakeAPI(t, fleetConfigMap(m), kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}))
	c.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("resourceslices is forbidden")
	})
	r := startOn(t, c)
	r.eventually(t, "not ready", func() string {
		if err := r.p.Ready(); err == nil || !strings.Contains(err.Error(), "node kwok-a: publishing failed") || !strings.Contains(err.Error(), "forbidden") {
			return fmt.Sprintf("Ready: %v", err)
		}
		return ""
	})
}

// TestOwnClientMarks: whichever API version the controller's client
// settles on, what it creates or updates carries the mark, and what it
// lists or watches selects on it; what could reach another's slice is
// refused.
func TestOwnClientMarks(t *testing.T) {
	ctx := context.Background()
	c := ownClient{fake.NewSimpleClientset()}
	var lists []string
	c.Interface.(*fake.Clientset).PrependReactor("list", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		lists = append(lists, a.(k8stesting.ListAction).GetListRestrictions().Labels.String())
		return false, nil, nil
	})
	v1, err := c.ResourceV1().ResourceSlices().Create(ctx, &resourcev1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "a", Labels: map[string]string{"x": "y"}}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{"x": "y", OwnLabel: OwnValue}, v1.Labels)
	v1.Labels = nil
	v1, err = c.ResourceV1().ResourceSlices().Update(ctx, v1, metav1.UpdateOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{OwnLabel: OwnValue}, v1.Labels)
	b2, err := c.ResourceV1beta2().ResourceSlices().Create(ctx, &resourcev1beta2.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "b"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{OwnLabel: OwnValue}, b2.Labels)
	b1, err := c.ResourceV1beta1().ResourceSlices().Create(ctx, &resourcev1beta1.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "c"}}, metav1.CreateOptions{})
	require.NoError(t, err)
	require.Equal(t, map[string]string{OwnLabel: OwnValue}, b1.Labels)

	_, err = c.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	require.NoError(t, err)
	_, err = c.ResourceV1beta1().ResourceSlices().List(ctx, metav1.ListOptions{LabelSelector: "x=y"})
	require.NoError(t, err)
	require.Equal(t, []string{OwnLabel + "=" + OwnValue, OwnLabel + "=" + OwnValue + ",x=y"}, lists)

	require.Error(t, c.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}))
	_, err = c.ResourceV1beta2().ResourceSlices().Patch(ctx, "b", types.MergePatchType, []byte("{}"), metav1.PatchOptions{})
	require.ErrorContains(t, err, "the publisher does not patch ResourceSlices")
}

// TestPublisherWarnsOfMockDefaults: a profile that leaves an NVML fact to
// nvml-mock's A100 defaults is published, with a warning naming the field
// and the default, since the drivers would publish the A100's value as the
// board's; a built-in, whose facts are its board's, warns of nothing; and
// a profile warns once, not once for each node it is given.
func TestPublisherWarnsOfMockDefaults(t *testing.T) {
	bare := strings.Replace(builtinText(t, "t4-vm"), "\n  architecture: turing\n", "\n", 1)
	require.NotEqual(t, builtinText(t, "t4-vm"), bare, "t4-vm states its architecture")
	fleetYAML := "nodes: {kwok-a: bare.yaml, kwok-c: bare.yaml}\ndefault: t4-vm\n"
	r := start(t,
		fleetConfigMap(map[string]string{fleet.ConfigMapKey: fleetYAML, "bare.yaml": bare}),
		kwokNode("kwok-a", map[string]string{kwokLabel: "kwok"}),
		kwokNode("kwok-b", map[string]string{kwokLabel: "kwok"}),
		kwokNode("kwok-c", map[string]string{kwokLabel: "kwok"}),
	)
	r.eventually(t, "kwok-b published", func() string { return r.samePublished(t, "kwok-b", planned(t, "t4-vm", "kwok-b")) })
	for _, node := range []string{"kwok-a", "kwok-c"} {
		r.eventually(t, node+" published", func() string {
			if len(r.slicesOf(t, node)) == 0 {
				return "no slices"
			}
			return ""
		})
	}
	var warnings []string
	for line := range strings.Lines(r.log.String()) {
		if strings.Contains(line, "level=WARN") {
			warnings = append(warnings, line)
		}
	}
	require.NotEmpty(t, warnings, "no warning:\n%s", r.log)
	prof, err := resourceslices.Parse("bare.yaml", []byte(bare))
	require.NoError(t, err)
	require.Len(t, warnings, len(prof.MockDefaults()), "one warning a field, once for the profile, however many nodes it is given:\n%s", r.log)
	for _, w := range warnings {
		require.Contains(t, w, "bare.yaml", "a built-in leaves nothing to the defaults")
	}
	require.Contains(t, warnings[0], "device_defaults.architecture not set")
	require.Contains(t, warnings[0], "ampere")
}
