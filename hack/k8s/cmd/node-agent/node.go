package main

// The Node object and its Lease, kept the way the kubelet keeps them: the node
// registers itself, reports capacity and a Ready condition, and renews a Lease
// in kube-node-lease so the control plane sees it alive.

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/component-helpers/apimachinery/lease"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

const (
	leaseDurationSeconds = 40
	leaseRenewInterval   = 10 * time.Second
	statusInterval       = 5 * time.Minute // like the kubelet's nodeStatusReportFrequency
)

type nodeKeeper struct {
	client   kubernetes.Interface
	name     string
	labels   map[string]string
	capacity v1.ResourceList
}

func newNodeKeeper(client kubernetes.Interface, name string, labels map[string]string, capacity map[string]resource.Quantity) *nodeKeeper {
	list := v1.ResourceList{}
	for k, v := range capacity {
		list[v1.ResourceName(k)] = v
	}
	all := map[string]string{"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
	for k, v := range labels {
		all[k] = v
	}
	return &nodeKeeper{client: client, name: name, labels: all, capacity: list}
}

func (n *nodeKeeper) get(ctx context.Context) (*v1.Node, error) {
	return n.client.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
}

// register creates the Node (or adopts an existing one) and sets its status.
// Updates are patches, as the kubelet's: NodeRestriction refuses a node that
// writes back a stale copy of its own taints.
func (n *nodeKeeper) register(ctx context.Context) error {
	node := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name, Labels: n.labels}}
	_, err := n.client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": n.labels}})
		_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	}
	if err != nil {
		return err
	}
	return n.updateStatus(ctx)
}

func (n *nodeKeeper) updateStatus(ctx context.Context) error {
	now := metav1.Now()
	status := v1.NodeStatus{
		Capacity:    n.capacity.DeepCopy(),
		Allocatable: n.capacity.DeepCopy(),
		Addresses:   []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "127.0.0.1"}, {Type: v1.NodeHostName, Address: n.name}},
		NodeInfo: v1.NodeSystemInfo{
			KubeletVersion: "patchbay-node-agent", OperatingSystem: "linux", Architecture: "amd64",
		},
		Conditions: []v1.NodeCondition{{
			Type: v1.NodeReady, Status: v1.ConditionTrue, Reason: "KubeletReady",
			Message: "patchbay node agent is posting ready status", LastHeartbeatTime: now, LastTransitionTime: now,
		}},
	}
	if node, err := n.get(ctx); err == nil {
		for _, c := range node.Status.Conditions {
			if c.Type == v1.NodeReady && c.Status == v1.ConditionTrue {
				status.Conditions[0].LastTransitionTime = c.LastTransitionTime
			}
		}
	}
	patch, err := json.Marshal(map[string]any{"status": status})
	if err != nil {
		return err
	}
	_, err = n.client.CoreV1().Nodes().Patch(ctx, n.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}, "status")
	if err != nil {
		return fmt.Errorf("patch node status: %w", err)
	}
	return nil
}

// run renews the Lease and refreshes the Ready heartbeat until ctx ends.
func (n *nodeKeeper) run(ctx context.Context) {
	setOwner := func(l *coordinationv1.Lease) error {
		if len(l.OwnerReferences) > 0 {
			return nil
		}
		node, err := n.get(ctx)
		if err != nil {
			return err
		}
		l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID}}
		return nil
	}
	lc := lease.NewController(clock.RealClock{}, n.client, n.name, leaseDurationSeconds, nil,
		leaseRenewInterval, n.name, v1.NamespaceNodeLease, setOwner)
	go lc.Run(ctx)
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := n.updateStatus(ctx); err != nil {
			klog.ErrorS(err, "node status heartbeat failed", "node", n.name)
		}
	}, statusInterval)
}
