package main

// The pod lifecycle the kubelet would drive, minus containers: prepare a
// pod's claims through the DRA manager, resolve its containers' CDI devices,
// report it Running; complete it after `patchbay.dev/complete-after`;
// unprepare and finalise deletion (grace 0) when it is deleted. A failed
// prepare records the kubelet's FailedPrepareDynamicResources Event on the pod.
// A pod's claims include the one the scheduler made for its extended
// resources (pod.status.extendedResourceClaimStatus, KEP-5004): the DRA
// manager adds it to prepare, unprepare and each container's CDI devices, as
// in the kubelet, and our statuses keep that field (baseStatus copies it).

import (
	"context"
	"fmt"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/events"
)

const (
	completeAfterAnnotation = "patchbay.dev/complete-after"
	workers                 = 4
)

type podWorker struct {
	client   kubernetes.Interface
	nodeName string
	manager  *dra.Manager
	recorder record.EventRecorder
	stateDir string
	cdi      *cdiResolver
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]

	mu    sync.Mutex
	known map[string]*v1.Pod // last seen copy of pods we may have prepared
	done  map[types.UID]bool // pods whose claims are unprepared for good
}

func newPodWorker(client kubernetes.Interface, nodeName string, manager *dra.Manager, recorder record.EventRecorder, stateDir, cdiRoot string) (*podWorker, error) {
	resolver, err := newCDIResolver(cdiRoot)
	if err != nil {
		return nil, err
	}
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + nodeName }))
	w := &podWorker{
		client: client, nodeName: nodeName, manager: manager, recorder: recorder, stateDir: stateDir, cdi: resolver,
		factory: factory, informer: factory.Core().V1().Pods().Informer(),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		known: map[string]*v1.Pod{}, done: map[types.UID]bool{},
	}
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			w.queue.Add(key)
		}
	}
	_, err = w.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: enqueue, UpdateFunc: func(_, obj any) { enqueue(obj) }, DeleteFunc: enqueue,
	})
	return w, err
}

func (w *podWorker) synced() bool { return w.informer.HasSynced() }

// activePods is what the DRA manager's reconcile loop keeps prepared.
func (w *podWorker) activePods() []*v1.Pod {
	var pods []*v1.Pod
	for _, obj := range w.informer.GetStore().List() {
		pod := obj.(*v1.Pod)
		if pod.Status.Phase != v1.PodSucceeded && pod.Status.Phase != v1.PodFailed {
			pods = append(pods, pod)
		}
	}
	return pods
}

func (w *podWorker) run(ctx context.Context) {
	defer w.queue.ShutDown()
	w.factory.Start(ctx.Done())
	cache.WaitForCacheSync(ctx.Done(), w.informer.HasSynced)
	for range workers {
		go func() {
			for w.processNext(ctx) {
			}
		}()
	}
	<-ctx.Done()
}

func (w *podWorker) processNext(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)
	if err := w.sync(ctx, key); err != nil {
		klog.ErrorS(err, "pod sync failed, will retry", "pod", key)
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	return true
}

func (w *podWorker) sync(ctx context.Context, key string) error {
	obj, exists, err := w.informer.GetStore().GetByKey(key)
	if err != nil {
		return err
	}
	w.mu.Lock()
	last := w.known[key]
	w.mu.Unlock()
	if !exists {
		if last != nil { // deleted behind our back: clean up what we prepared
			return w.finish(ctx, key, last, false)
		}
		return nil
	}
	pod := obj.(*v1.Pod)
	if last != nil && last.UID != pod.UID { // same name, new pod: the old one is gone
		if err := w.finish(ctx, key, last, false); err != nil {
			return err
		}
	}
	w.mu.Lock()
	w.known[key] = pod
	done := w.done[pod.UID]
	w.mu.Unlock()
	switch {
	case pod.DeletionTimestamp != nil:
		return w.finish(ctx, key, pod, true)
	case pod.Status.Phase == v1.PodSucceeded || pod.Status.Phase == v1.PodFailed:
		if done {
			return nil
		}
		return w.unprepare(ctx, pod)
	case pod.Status.Phase == v1.PodRunning:
		if err := w.refreshHealth(ctx, pod); err != nil {
			return err
		}
		return w.maybeComplete(ctx, key, pod)
	default:
		return w.start(ctx, key, pod)
	}
}

func (w *podWorker) start(ctx context.Context, key string, pod *v1.Pod) error {
	if err := w.manager.PrepareResources(ctx, pod); err != nil {
		// The kubelet's Event, word for word (pkg/kubelet/kuberuntime, SyncPod).
		w.recorder.Eventf(pod, v1.EventTypeWarning, events.FailedPrepareDynamicResources, "Failed to prepare dynamic resources: %v", err)
		if !alreadyWaiting(pod, "FailedPrepareDynamicResources", err.Error()) {
			if serr := w.setStatus(ctx, pod, waitingStatus(pod, "FailedPrepareDynamicResources", err.Error())); serr != nil {
				klog.ErrorS(serr, "status update failed", "pod", key)
			}
		}
		return err
	}
	rec := &podRecord{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), Node: w.nodeName,
		Containers: map[string]containerRecord{}}
	for i := range pod.Spec.Containers {
		c := &pod.Spec.Containers[i]
		info, err := w.manager.GetResources(pod, c)
		if err != nil {
			return fmt.Errorf("container %s: %w", c.Name, err)
		}
		var ids []string
		for _, d := range info.CDIDevices {
			ids = append(ids, d.Name)
		}
		cr, err := w.cdi.resolve(ids)
		if err != nil {
			klog.InfoS("pod fails: CDI devices do not resolve", "pod", key, "container", c.Name, "err", err)
			if serr := w.setStatus(ctx, pod, failedStatus(pod, "CDIResolutionFailed", fmt.Sprintf("container %s: %v", c.Name, err))); serr != nil {
				return serr
			}
			return w.unprepare(ctx, pod)
		}
		rec.Containers[c.Name] = cr
	}
	if err := writeRecord(w.stateDir, pod, rec); err != nil {
		return fmt.Errorf("write pod record: %w", err)
	}
	if err := w.setStatus(ctx, pod, w.withHealth(ctx, pod, runningStatus(pod))); err != nil {
		return err
	}
	klog.InfoS("pod running", "pod", key, "containers", len(rec.Containers))
	return nil
}

func (w *podWorker) maybeComplete(ctx context.Context, key string, pod *v1.Pod) error {
	value, ok := pod.Annotations[completeAfterAnnotation]
	if !ok {
		return nil
	}
	after, err := time.ParseDuration(value)
	if err != nil {
		klog.InfoS("ignoring invalid annotation", "pod", key, "annotation", completeAfterAnnotation, "value", value)
		return nil
	}
	started := time.Now()
	if pod.Status.StartTime != nil {
		started = pod.Status.StartTime.Time
	}
	if remaining := time.Until(started.Add(after)); remaining > 0 {
		w.queue.AddAfter(key, remaining)
		return nil
	}
	if err := w.setStatus(ctx, pod, succeededStatus(pod)); err != nil {
		return err
	}
	klog.InfoS("pod completed", "pod", key, "after", after)
	return w.unprepare(ctx, pod)
}

func (w *podWorker) unprepare(ctx context.Context, pod *v1.Pod) error {
	if err := w.manager.UnprepareResources(ctx, pod); err != nil {
		return err
	}
	w.mu.Lock()
	w.done[pod.UID] = true
	w.mu.Unlock()
	return nil
}

// finish unprepares a pod that is being deleted (or already gone), removes its
// record and, if it still exists, deletes it for good with grace period 0.
func (w *podWorker) finish(ctx context.Context, key string, pod *v1.Pod, deleteObject bool) error {
	if err := w.unprepare(ctx, pod); err != nil {
		return err
	}
	if err := removeRecord(w.stateDir, pod); err != nil {
		return err
	}
	if deleteObject {
		zero := int64(0)
		err := w.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID},
		})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("delete pod: %w", err)
		}
		klog.InfoS("pod deleted", "pod", key)
	}
	w.mu.Lock()
	if cur := w.known[key]; cur != nil && cur.UID == pod.UID {
		delete(w.known, key)
	}
	delete(w.done, pod.UID)
	w.mu.Unlock()
	return nil
}

func (w *podWorker) setStatus(ctx context.Context, pod *v1.Pod, status *v1.PodStatus) error {
	updated := pod.DeepCopy()
	updated.Status = *status
	_, err := w.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	if err != nil {
		return fmt.Errorf("update pod status: %w", err)
	}
	return nil
}
