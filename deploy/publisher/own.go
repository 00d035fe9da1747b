package publisher

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourcev1 "k8s.io/api/resource/v1"
	resourcev1beta1 "k8s.io/api/resource/v1beta1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	resourcev1ac "k8s.io/client-go/applyconfigurations/resource/v1"
	resourcev1beta1ac "k8s.io/client-go/applyconfigurations/resource/v1beta1"
	resourcev1beta2ac "k8s.io/client-go/applyconfigurations/resource/v1beta2"
	"k8s.io/client-go/kubernetes"
	resourcev1client "k8s.io/client-go/kubernetes/typed/resource/v1"
	resourcev1beta1client "k8s.io/client-go/kubernetes/typed/resource/v1beta1"
	resourcev1beta2client "k8s.io/client-go/kubernetes/typed/resource/v1beta2"
	"k8s.io/client-go/util/watchlist"
)

// The publisher's mark on every slice it writes, a label (a list can
// select on it, an annotation it cannot): the slices it lists, updates
// and deletes are those that carry it, and no other. It also tells
// whoever reads a slice that its devices are simulated, though the
// slice carries a real driver's name. The chart's admission policy
// requires the same label of the publisher's account's writes.
const (
	OwnLabel = "nvml-mock-sysfs.nvidia.com/published-by"
	OwnValue = "nvml-mock-sysfs-publish"
)

// KWOK's own mark of the Nodes it manages (kwokctl runs the controller
// with --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake,
// and KWOK's documentation makes its Nodes so): the publisher publishes
// on such a Node alone, whatever the selector names, since a Node
// without it may be a real one, whose kubelet plugins publish its slices.
const (
	KWOKNodeAnnotation = "kwok.x-k8s.io/node"
	KWOKNodeValue      = "fake"
)

// isKWOKNode says whether n is KWOK's.
func isKWOKNode(n *corev1.Node) bool {
	return n.Annotations[KWOKNodeAnnotation] == KWOKNodeValue
}

// ownSelector is the label selector of the publisher's slices, added to
// sel (a list's label selector, maybe empty).
func ownSelector(sel string) string {
	own := OwnLabel + "=" + OwnValue
	if sel == "" {
		return own
	}
	return sel + "," + own
}

// ownClient is the client the ResourceSlice controllers get: the
// controller of k8s.io/dynamic-resource-allocation lists and watches every
// slice of its driver on its node and deletes those its pool does not
// want, whoever wrote them, and sets no label. Through this client it sees
// the publisher's slices alone (its list and watch select on OwnLabel, so
// the API server filters them), and every slice it creates or updates
// carries OwnLabel: a slice the publisher did not write is nothing the
// controller can update or delete. Whichever API version the controller's
// client settles on (it falls back to the betas where v1 is not served),
// the same holds.
type ownClient struct {
	kubernetes.Interface
}

// IsWatchListSemanticsUnSupported passes on what the wrapped client says
// of streaming lists (the controller's informer asks its client, and the
// fake clientset of the tests says it has none): the wrapper changes no
// protocol.
func (c ownClient) IsWatchListSemanticsUnSupported() bool {
	return watchlist.DoesClientNotSupportWatchListSemantics(c.Interface)
}

func (c ownClient) ResourceV1() resourcev1client.ResourceV1Interface {
	return ownV1{c.Interface.ResourceV1()}
}

func (c ownClient) ResourceV1beta2() resourcev1beta2client.ResourceV1beta2Interface {
	return ownV1beta2{c.Interface.ResourceV1beta2()}
}

func (c ownClient) ResourceV1beta1() resourcev1beta1client.ResourceV1beta1Interface {
	return ownV1beta1{c.Interface.ResourceV1beta1()}
}

type ownV1 struct {
	resourcev1client.ResourceV1Interface
}

func (v ownV1) ResourceSlices() resourcev1client.ResourceSliceInterface {
	return ownSlices[resourcev1.ResourceSlice, resourcev1.ResourceSliceList, resourcev1ac.ResourceSliceApplyConfiguration]{v.ResourceV1Interface.ResourceSlices()}
}

type ownV1beta2 struct {
	resourcev1beta2client.ResourceV1beta2Interface
}

func (v ownV1beta2) ResourceSlices() resourcev1beta2client.ResourceSliceInterface {
	return ownSlices[resourcev1beta2.ResourceSlice, resourcev1beta2.ResourceSliceList, resourcev1beta2ac.ResourceSliceApplyConfiguration]{v.ResourceV1beta2Interface.ResourceSlices()}
}

type ownV1beta1 struct {
	resourcev1beta1client.ResourceV1beta1Interface
}

func (v ownV1beta1) ResourceSlices() resourcev1beta1client.ResourceSliceInterface {
	return ownSlices[resourcev1beta1.ResourceSlice, resourcev1beta1.ResourceSliceList, resourcev1beta1ac.ResourceSliceApplyConfiguration]{v.ResourceV1beta1Interface.ResourceSlices()}
}

// sliceAPI is a typed client of ResourceSlices, of any API version.
type sliceAPI[T, L, AC any] interface {
	Create(context.Context, *T, metav1.CreateOptions) (*T, error)
	Update(context.Context, *T, metav1.UpdateOptions) (*T, error)
	Delete(context.Context, string, metav1.DeleteOptions) error
	DeleteCollection(context.Context, metav1.DeleteOptions, metav1.ListOptions) error
	Get(context.Context, string, metav1.GetOptions) (*T, error)
	List(context.Context, metav1.ListOptions) (*L, error)
	Watch(context.Context, metav1.ListOptions) (watch.Interface, error)
	Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*T, error)
	Apply(context.Context, *AC, metav1.ApplyOptions) (*T, error)
}

// ownSlices is api seen through the publisher's mark: lists and watches
// of its slices alone, creates and updates that mark what they write.
// Delete deletes by name what a list gave (the controller deletes only
// slices its informer holds). What the controller does not call (a
// collection's delete, a patch, an apply: each could reach a slice the
// publisher did not write) is refused, so that a controller that starts
// calling it fails loudly instead of reaching further.
type ownSlices[T, L, AC any] struct {
	api sliceAPI[T, L, AC]
}

func (s ownSlices[T, L, AC]) Create(ctx context.Context, obj *T, o metav1.CreateOptions) (*T, error) {
	markOwn(obj)
	return s.api.Create(ctx, obj, o)
}

func (s ownSlices[T, L, AC]) Update(ctx context.Context, obj *T, o metav1.UpdateOptions) (*T, error) {
	markOwn(obj)
	return s.api.Update(ctx, obj, o)
}

func (s ownSlices[T, L, AC]) Delete(ctx context.Context, name string, o metav1.DeleteOptions) error {
	return s.api.Delete(ctx, name, o)
}

func (s ownSlices[T, L, AC]) Get(ctx context.Context, name string, o metav1.GetOptions) (*T, error) {
	return s.api.Get(ctx, name, o)
}

func (s ownSlices[T, L, AC]) List(ctx context.Context, o metav1.ListOptions) (*L, error) {
	o.LabelSelector = ownSelector(o.LabelSelector)
	return s.api.List(ctx, o)
}

func (s ownSlices[T, L, AC]) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	o.LabelSelector = ownSelector(o.LabelSelector)
	return s.api.Watch(ctx, o)
}

func (s ownSlices[T, L, AC]) DeleteCollection(context.Context, metav1.DeleteOptions, metav1.ListOptions) error {
	return notOwn("delete a collection of")
}

func (s ownSlices[T, L, AC]) Patch(context.Context, string, types.PatchType, []byte, metav1.PatchOptions, ...string) (*T, error) {
	return nil, notOwn("patch")
}

func (s ownSlices[T, L, AC]) Apply(context.Context, *AC, metav1.ApplyOptions) (*T, error) {
	return nil, notOwn("apply")
}

// markOwn puts the publisher's mark on a slice it writes. Every version's
// ResourceSlice is a metav1.Object through its pointer.
func markOwn[T any](obj *T) {
	m, ok := any(obj).(metav1.Object)
	if !ok {
		return
	}
	l := m.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[OwnLabel] = OwnValue
	m.SetLabels(l)
}

// notOwn refuses a call the publisher makes no use of.
func notOwn(verb string) error {
	return apierrors.NewForbidden(resourcev1.Resource("resourceslices"), "",
		fmt.Errorf("the publisher does not %s ResourceSlices: it could reach slices without %s=%s", verb, OwnLabel, OwnValue))
}
