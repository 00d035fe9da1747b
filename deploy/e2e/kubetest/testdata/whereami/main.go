// Command whereami is the worker harness's in-cluster probe: from a pod,
// through client-go's in-cluster configuration (the kubelet's
// KUBERNETES_SERVICE_HOST and _PORT, the pod's ServiceAccount token and
// kube-root-ca.crt, nothing set by the test), it reads its own Node and
// prints the node's name and addresses, one line:
//
//	node NAME addresses TYPE=ADDRESS,...
//
// NODE_NAME comes from the downward API.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "whereami:", err)
		os.Exit(1)
	}
}

func run() error {
	config, err := rest.InClusterConfig()
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	name := os.Getenv("NODE_NAME")
	node, err := client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("the API server at %s: %w", config.Host, err)
	}
	var addresses []string
	for _, a := range node.Status.Addresses {
		addresses = append(addresses, string(a.Type)+"="+a.Address)
	}
	fmt.Printf("node %s addresses %s\n", node.Name, strings.Join(addresses, ","))
	return nil
}
