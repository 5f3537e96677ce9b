package main

// Device health in pod status, as the kubelet reports it (KEP-4680): the
// DRA manager keeps the health the plugins stream (NodeWatchResources) and
// names the pods whose devices changed; we re-sync those pods, and a running
// pod's container statuses get allocatedResourcesStatus from the manager.

import (
	"context"
	"slices"

	v1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/resourceupdates"
)

// followHealth queues every pod the DRA manager reports a health change for.
func (w *podWorker) followHealth(ctx context.Context, updates <-chan resourceupdates.Update) {
	for {
		select {
		case <-ctx.Done():
			return
		case u := <-updates:
			for _, obj := range w.informer.GetStore().List() {
				pod := obj.(*v1.Pod)
				if !slices.Contains(u.PodUIDs, string(pod.UID)) {
					continue
				}
				if key, err := cache.MetaNamespaceKeyFunc(pod); err == nil {
					w.queue.Add(key)
				}
			}
		}
	}
}

// withHealth is status with the health of the pod's allocated devices.
func (w *podWorker) withHealth(ctx context.Context, pod *v1.Pod, status *v1.PodStatus) *v1.PodStatus {
	w.manager.UpdateAllocatedResourcesStatus(klog.FromContext(ctx), pod, status)
	return status
}

// refreshHealth re-posts a running pod's status when its devices' health changed.
func (w *podWorker) refreshHealth(ctx context.Context, pod *v1.Pod) error {
	status := w.withHealth(ctx, pod, pod.Status.DeepCopy())
	if apiequality.Semantic.DeepEqual(status.ContainerStatuses, pod.Status.ContainerStatuses) {
		return nil
	}
	klog.InfoS("device health changed", "pod", klog.KObj(pod))
	return w.setStatus(ctx, pod, status)
}
