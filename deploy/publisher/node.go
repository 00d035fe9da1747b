package publisher

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	resourcev1 "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/nvml-mock/nvml-mock-sysfs/overlay/resourceslices"
)

// nodePublisher publishes one node's slices, one ResourceSlice controller
// per driver, in a goroutine of its own: a controller's start waits for its
// informer (a second or so), which a fleet of nodes must not wait for one
// after another. It takes the latest state posted and skips the ones in
// between.
type nodePublisher struct {
	p    *Publisher
	name string
	mail chan struct{}
	done chan struct{} // closed when run returns

	mu   sync.Mutex
	uid  types.UID
	want map[string]*resourceslice.DriverResources
	gone bool // the slices are to be withdrawn, and the goroutine to end
	// failed is the last error the controllers reported, at failedAt.
	failed   error
	failedAt time.Time
}

// recentFailure is how long a publishing error keeps /readyz failing: the
// controllers retry with a growing backoff and say nothing when a retry
// succeeds, so an error is news for this long.
const recentFailure = time.Minute

// failing is the node's last publishing error if it is recent.
func (n *nodePublisher) failing(now time.Time) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.failed != nil && now.Sub(n.failedAt) < recentFailure {
		return fmt.Errorf("publishing failed %s ago: %w", now.Sub(n.failedAt).Round(time.Second), n.failed)
	}
	return nil
}

// startNode starts node's publisher, once its last one, if withdrawing,
// has deleted its slices; it ends with ctx, or once withdrawn. p.mu is
// held.
func (p *Publisher) startNode(ctx context.Context, name string) *nodePublisher {
	n := &nodePublisher{p: p, name: name, mail: make(chan struct{}, 1), done: make(chan struct{})}
	last := p.leaving[name]
	delete(p.leaving, name)
	p.actors.Add(1)
	go func() {
		defer p.actors.Done()
		defer close(n.done)
		if last != nil {
			select {
			case <-last.done:
			case <-ctx.Done():
				return
			}
		}
		n.run(ctx)
	}()
	return n
}

// post hands the node's publisher what to publish for the Node of uid;
// nil withdraws its slices.
func (n *nodePublisher) post(uid types.UID, want map[string]*resourceslice.DriverResources) {
	n.mu.Lock()
	n.uid, n.want, n.gone = uid, want, want == nil
	n.mu.Unlock()
	select {
	case n.mail <- struct{}{}:
	default:
	}
}

func (n *nodePublisher) run(ctx context.Context) {
	controllers := map[string]*resourceslice.Controller{}
	// withdrawn are the drivers with no controller here whose slices on
	// the node were deleted, so that it lists them once.
	withdrawn := map[string]bool{}
	var owner types.UID
	stop := func() {
		for _, c := range controllers {
			c.Stop()
		}
		clear(controllers)
	}
	defer stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.mail:
		}
		n.mu.Lock()
		uid, want, gone := n.uid, n.want, n.gone
		n.mu.Unlock()
		// A node deleted and made again under its name is another owner:
		// the controllers cache theirs, and the old one's slices go.
		if gone || (owner != "" && uid != owner) {
			drivers := slices.Collect(maps.Keys(controllers))
			stop()
			n.deleteSlices(ctx, drivers)
			clear(withdrawn)
			if gone {
				return
			}
		}
		owner = uid
		// A driver this process never published on the node may have
		// slices there all the same, an earlier publisher's (one given
		// another map, or the node another profile, before a restart),
		// known by the mark: withdrawn once, as the controller of a
		// driver it runs would. Another's slices stay.
		var stale []string
		for _, driver := range resourceslices.Drivers() {
			if _, ok := want[driver]; !ok && controllers[driver] == nil && !withdrawn[driver] {
				stale = append(stale, driver)
				withdrawn[driver] = true
			}
		}
		n.deleteSlices(ctx, stale)
		for _, driver := range slices.Sorted(maps.Keys(controllers)) {
			if _, ok := want[driver]; !ok {
				// The driver has nothing on the node any more.
				controllers[driver].Update(nil)
			}
		}
		// The running controllers first: a new one's start waits for its
		// informer's sync (it polls each second), which an update of
		// another driver's slices must not wait for.
		for _, driver := range slices.Sorted(maps.Keys(want)) {
			if c, ok := controllers[driver]; ok {
				c.Update(want[driver])
			}
		}
		for _, driver := range slices.Sorted(maps.Keys(want)) {
			if controllers[driver] != nil {
				continue
			}
			c, err := resourceslice.StartController(ctx, resourceslice.Options{
				DriverName: driver,
				KubeClient: ownClient{n.p.o.Client},
				Owner:      &resourceslice.Owner{APIVersion: "v1", Kind: "Node", Name: n.name, UID: uid},
				Resources:  want[driver],
				ErrorHandler: func(_ context.Context, err error, msg string) {
					n.mu.Lock()
					n.failed, n.failedAt = err, time.Now()
					n.mu.Unlock()
					n.p.log.Error("publishing failed; the controller tries again", "node", n.name, "driver", driver, "what", msg, "err", err)
				},
			})
			if err != nil {
				if ctx.Err() == nil {
					n.p.log.Error("cannot start publishing", "node", n.name, "driver", driver, "err", err)
				}
				continue
			}
			controllers[driver] = c
			delete(withdrawn, driver)
		}
	}
}

// deleteSlices deletes the node's slices of drivers that the publisher
// wrote (they carry its mark), as a kubelet removes a plugin's when it
// goes; a slice someone else wrote stays. The controllers are stopped
// first, so none makes them again.
func (n *nodePublisher) deleteSlices(ctx context.Context, drivers []string) {
	api := ownClient{n.p.o.Client}.ResourceV1().ResourceSlices()
	for _, driver := range drivers {
		list, err := api.List(ctx, metav1.ListOptions{FieldSelector: fields.Set{
			resourcev1.ResourceSliceSelectorNodeName: n.name,
			resourcev1.ResourceSliceSelectorDriver:   driver,
		}.String()})
		if err != nil {
			n.p.log.Error("cannot list the slices to withdraw", "node", n.name, "driver", driver, "err", err)
			continue
		}
		for _, s := range list.Items {
			// The selectors are the API server's to apply; a slice of
			// another node or driver, or without the mark, is never ours
			// to delete.
			if s.Spec.NodeName == nil || *s.Spec.NodeName != n.name || s.Spec.Driver != driver || s.Labels[OwnLabel] != OwnValue {
				continue
			}
			err := api.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
			if err != nil && !apierrors.IsNotFound(err) && !errors.Is(err, context.Canceled) {
				n.p.log.Error("cannot withdraw a slice", "node", n.name, "slice", s.Name, "err", err)
			}
		}
	}
}
