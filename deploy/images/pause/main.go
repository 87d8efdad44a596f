// The sandbox's first process on the test kit's real nodes: it holds the
// pod's namespaces, reaps the orphans the pod's containers leave to it, and
// exits on SIGINT or SIGTERM. Static (CGO_ENABLED=0), so the image is this
// one file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range signals {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
