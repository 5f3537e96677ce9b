// Command etcd is upstream's etcd server at the version k8s.io/kubernetes
// itself requires (see go.sum), so the apiserver and its storage match.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
