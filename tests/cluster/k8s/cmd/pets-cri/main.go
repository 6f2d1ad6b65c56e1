// pets-cri: the two CRI calls tests/cluster needs and that ctr cannot make (crictl is not
// published on the Go module proxy): list the pod sandboxes, and stop+remove every one of them
// through the CRI, so containerd tears down each pod's network (CNI DEL) before it stops.
//
// usage: pets-cri -endpoint unix:///path/containerd.sock list|remove-all
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	remote "k8s.io/cri-client/pkg"
	"k8s.io/klog/v2"
)

func main() {
	endpoint := flag.String("endpoint", "", "CRI endpoint, e.g. unix:///run/containerd/containerd.sock")
	timeout := flag.Duration("timeout", 2*time.Minute, "overall time limit")
	flag.Parse()
	if *endpoint == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: pets-cri -endpoint unix:///path.sock list|remove-all")
		os.Exit(2)
	}
	logger := klog.Background()
	rs, err := remote.NewRemoteRuntimeService(*endpoint, 10*time.Second, nil, &logger)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pets-cri: cannot connect to %s: %v\n", *endpoint, err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	pods, err := rs.ListPodSandbox(ctx, nil)
	if err != nil {
		fmt.Fprintf(os.Stderr, "pets-cri: list pod sandboxes: %v\n", err)
		os.Exit(1)
	}
	switch flag.Arg(0) {
	case "list":
		for _, p := range pods {
			m := p.GetMetadata()
			fmt.Printf("%s\t%s/%s\t%s\n", p.GetId()[:13], m.GetNamespace(), m.GetName(), p.GetState())
		}
	case "remove-all":
		failed := 0
		for _, p := range pods {
			m := p.GetMetadata()
			name := m.GetNamespace() + "/" + m.GetName()
			if err := rs.StopPodSandbox(ctx, p.GetId()); err != nil {
				fmt.Fprintf(os.Stderr, "pets-cri: stop %s: %v\n", name, err)
				failed++
				continue
			}
			if err := rs.RemovePodSandbox(ctx, p.GetId()); err != nil {
				fmt.Fprintf(os.Stderr, "pets-cri: remove %s: %v\n", name, err)
				failed++
				continue
			}
			fmt.Printf("removed pod sandbox %s\n", name)
		}
		if failed > 0 {
			os.Exit(1)
		}
	default:
		fmt.Fprintf(os.Stderr, "pets-cri: unknown command %q (expected list or remove-all)\n", flag.Arg(0))
		os.Exit(2)
	}
}
