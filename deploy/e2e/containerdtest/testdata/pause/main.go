// Command pause is a pod sandbox's process, the role of Kubernetes' pause
// image: it holds the sandbox's namespaces and does nothing until the
// runtime stops it. Built static, it is the sandbox image's only file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 the kernel delivers only signals with a handler, so the
	// runtime's SIGTERM needs this one to stop the sandbox promptly.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
