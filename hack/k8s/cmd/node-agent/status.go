package main

// Pod statuses the kubelet would report for our containerless pods.

import (
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func setCondition(status *v1.PodStatus, t v1.PodConditionType, value v1.ConditionStatus, reason string) {
	now := metav1.Now()
	for i := range status.Conditions {
		c := &status.Conditions[i]
		if c.Type == t {
			if c.Status != value {
				c.LastTransitionTime = now
			}
			c.Status, c.Reason = value, reason
			return
		}
	}
	status.Conditions = append(status.Conditions, v1.PodCondition{Type: t, Status: value, Reason: reason, LastTransitionTime: now})
}

func baseStatus(pod *v1.Pod) *v1.PodStatus {
	status := pod.Status.DeepCopy()
	status.HostIP = "127.0.0.1"
	status.HostIPs = []v1.HostIP{{IP: "127.0.0.1"}}
	if status.StartTime == nil {
		now := metav1.Now()
		status.StartTime = &now
	}
	return status
}

func containerStatuses(pod *v1.Pod, state func() v1.ContainerState, ready bool) []v1.ContainerStatus {
	var out []v1.ContainerStatus
	started := ready
	for _, c := range pod.Spec.Containers {
		out = append(out, v1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: "patchbay-agent://" + c.Image,
			ContainerID: "patchbay-agent://" + string(pod.UID) + "/" + c.Name,
			Ready:       ready, Started: &started, State: state(),
		})
	}
	return out
}

func runningStatus(pod *v1.Pod) *v1.PodStatus {
	status := baseStatus(pod)
	status.Phase = v1.PodRunning
	status.Reason, status.Message = "", ""
	for _, t := range []v1.PodConditionType{v1.PodReadyToStartContainers, v1.PodInitialized, v1.ContainersReady, v1.PodReady} {
		setCondition(status, t, v1.ConditionTrue, "")
	}
	now := metav1.Now()
	status.ContainerStatuses = containerStatuses(pod, func() v1.ContainerState {
		return v1.ContainerState{Running: &v1.ContainerStateRunning{StartedAt: now}}
	}, true)
	return status
}

func terminatedStatus(pod *v1.Pod, phase v1.PodPhase, exitCode int32, reason, message string) *v1.PodStatus {
	status := baseStatus(pod)
	status.Phase = phase
	if phase == v1.PodFailed {
		status.Reason, status.Message = reason, message
	}
	setCondition(status, v1.ContainersReady, v1.ConditionFalse, "PodCompleted")
	setCondition(status, v1.PodReady, v1.ConditionFalse, "PodCompleted")
	now := metav1.Now()
	status.ContainerStatuses = containerStatuses(pod, func() v1.ContainerState {
		return v1.ContainerState{Terminated: &v1.ContainerStateTerminated{
			ExitCode: exitCode, Reason: reason, Message: message, StartedAt: now, FinishedAt: now,
		}}
	}, false)
	return status
}

func succeededStatus(pod *v1.Pod) *v1.PodStatus {
	return terminatedStatus(pod, v1.PodSucceeded, 0, "Completed", "")
}

func failedStatus(pod *v1.Pod, reason, message string) *v1.PodStatus {
	return terminatedStatus(pod, v1.PodFailed, 128, reason, message)
}

// waitingStatus keeps the pod Pending with the reason visible on its containers.
func waitingStatus(pod *v1.Pod, reason, message string) *v1.PodStatus {
	status := baseStatus(pod)
	status.Phase = v1.PodPending
	status.ContainerStatuses = containerStatuses(pod, func() v1.ContainerState {
		return v1.ContainerState{Waiting: &v1.ContainerStateWaiting{Reason: reason, Message: message}}
	}, false)
	return status
}

// alreadyWaiting avoids rewriting an identical waiting status (each write would
// wake our own informer and bypass the retry backoff).
func alreadyWaiting(pod *v1.Pod, reason, message string) bool {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w == nil || w.Reason != reason || w.Message != message {
			return false
		}
	}
	return len(pod.Status.ContainerStatuses) > 0
}
