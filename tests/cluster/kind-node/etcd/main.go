// Command etcd is upstream etcd's server, built through the Go module proxy for the kind node
// image's registry.k8s.io/etcd image (kubeadm's static pod probes /livez and /readyz, which
// Debian's etcd 3.4 does not serve). The same main as upstream's etcd binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
