// Package kubeclient is the one home of how this binary reaches the API
// server: the config (a kubeconfig file, or the pod's service account) and,
// from it, the narrowest client each part needs. serve's node label watch
// reads object metadata only; serve's fleet mirror and publish's
// controllers need typed clients (the informers and the ResourceSlice
// controller take one), publish's with rate limits for a fleet.
package kubeclient

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// The fleet client's rate limits. client-go's defaults (5 per second,
// bursts of 10) would take minutes for a thousand nodes, whose controllers
// each list, watch and create at the start; a kubelet allows 50 and 100.
const (
	fleetQPS   = 50
	fleetBurst = 100
)

// Config is how this binary reaches the API server: kubeconfig names the
// file when given; otherwise the pod's service account is used
// (rest.InClusterConfig).
func Config(kubeconfig string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		return nil, fmt.Errorf("in-cluster API config (give a kubeconfig outside a pod): %w", err)
	}
	cfg.UserAgent = "nvml-mock-sysfs"
	return cfg, nil
}

// NodeMetadata is the metadata client of Nodes, Config's: serve's node
// label watch reads labels, which object metadata carries without the
// Node's status.
func NodeMetadata(kubeconfig string) (metadata.ResourceInterface, error) {
	cfg, err := Config(kubeconfig)
	if err != nil {
		return nil, err
	}
	c, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("API client: %w", err)
	}
	return c.Resource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}), nil
}

// Typed is the typed client, Config's, at client-go's default rate
// limits: serve's fleet mirror watches one ConfigMap with it.
func Typed(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := Config(kubeconfig)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfig(cfg)
}

// Fleet is the typed client, Config's, with rate limits for a fleet
// (fleetQPS, fleetBurst): publish's controllers, one per node and driver,
// share it.
func Fleet(kubeconfig string) (kubernetes.Interface, error) {
	cfg, err := Config(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = fleetQPS, fleetBurst
	return kubernetes.NewForConfig(cfg)
}
