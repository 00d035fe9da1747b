// Package apiwatch lists and watches API objects with client-go's
// informers, for the commands that follow them (publish, and serve's fleet
// map read through the API).
package apiwatch

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// ListWatcher is a typed client of one kind of object.
type ListWatcher[L runtime.Object] interface {
	List(ctx context.Context, opts metav1.ListOptions) (L, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Informer lists and watches api's objects (obj is one, for its type),
// narrowed by narrow. Typed calls, not a REST client's: client-go's fake
// clientset has none (nor streams a watch's initial list, which the wrapper
// asks client about, as the ResourceSlice controller does).
func Informer[L runtime.Object](client kubernetes.Interface, api ListWatcher[L], obj runtime.Object, narrow func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, lo metav1.ListOptions) (runtime.Object, error) {
			narrow(&lo)
			return api.List(ctx, lo)
		},
		WatchFuncWithContext: func(ctx context.Context, lo metav1.ListOptions) (watch.Interface, error) {
			narrow(&lo)
			return api.Watch(ctx, lo)
		},
	}, client), obj, 0, cache.Indexers{})
}

// ConfigMap is an informer of the ConfigMap name alone (a field selector
// on its name, which RBAC's resourceNames allows to list and watch).
func ConfigMap(client kubernetes.Interface, name types.NamespacedName) cache.SharedIndexInformer {
	return Informer(client, client.CoreV1().ConfigMaps(name.Namespace), &corev1.ConfigMap{}, func(lo *metav1.ListOptions) {
		lo.FieldSelector = fields.OneTermEqualSelector("metadata.name", name.Name).String()
	})
}

// ParseName parses NAMESPACE/NAME, each part as the API takes it: the
// form the commands' --fleet-configmap flags give a ConfigMap's name in.
func ParseName(s string) (types.NamespacedName, error) {
	ns, name, ok := strings.Cut(s, "/")
	switch {
	case !ok || ns == "" || name == "":
		return types.NamespacedName{}, fmt.Errorf("want NAMESPACE/NAME")
	case len(validation.IsDNS1123Label(ns)) > 0:
		return types.NamespacedName{}, fmt.Errorf("namespace %q: %s", ns, strings.Join(validation.IsDNS1123Label(ns), "; "))
	case len(validation.IsDNS1123Subdomain(name)) > 0:
		return types.NamespacedName{}, fmt.Errorf("name %q: %s", name, strings.Join(validation.IsDNS1123Subdomain(name), "; "))
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}
