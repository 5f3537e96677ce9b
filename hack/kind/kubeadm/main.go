// Command kubeadm is upstream's kubeadm at the release pinned in
// hack/k8s/go.mod, for the kind node image (hack/kind/node-image.sh).
// hack/kind.mk builds it in a copy of that module (go.mod and go.sum taken
// from hack/k8s, tidied there), so the pin keeps one owner.
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() { utilerrors.HandleError(app.Run()) }
