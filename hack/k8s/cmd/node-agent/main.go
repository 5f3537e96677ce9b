// Command node-agent plays the kubelet's part for Dynamic Resource Allocation
// in patchbay's local clusters, where no real kubelet or container runtime
// can run. It is assembled from the kubelet's own packages at the pinned
// release: the DRA manager (pkg/kubelet/cm/dra) prepares and unprepares
// claims, and the plugin manager (pkg/kubelet/pluginmanager) does the
// registration handshake with plugins found in <root-dir>/plugins_registry.
// Around them it keeps a Node object and its Lease, runs the pods bound to
// its node (prepare, resolve CDI devices, mark Running) and finalises their
// deletion, the way the kubelet would.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubelet/config"
	"k8s.io/kubernetes/pkg/kubelet/pluginmanager"
)

type options struct {
	kubeconfig string
	nodeName   string
	rootDir    string
	stateDir   string
	cdiRoot    string
	cpu        string
	memory     string
	pods       string
	labels     string
}

func parseFlags() options {
	var o options
	klog.InitFlags(nil)
	flag.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of this node's identity")
	flag.StringVar(&o.nodeName, "node-name", "", "name of the Node object to keep")
	flag.StringVar(&o.rootDir, "root-dir", "/var/lib/kubelet", "kubelet root: plugins_registry/ and plugins/ live here")
	flag.StringVar(&o.stateDir, "state-dir", "", "where per-pod records are written (default <root-dir>/agent)")
	flag.StringVar(&o.cdiRoot, "cdi-root", "/var/run/cdi", "CDI spec directory used to resolve device IDs")
	flag.StringVar(&o.cpu, "cpu", "8", "node capacity: cpu")
	flag.StringVar(&o.memory, "memory", "32Gi", "node capacity: memory")
	flag.StringVar(&o.pods, "pods", "110", "node capacity: pods")
	flag.StringVar(&o.labels, "node-labels", "", "comma-separated key=value labels for the Node")
	flag.Parse()
	if o.stateDir == "" {
		o.stateDir = filepath.Join(o.rootDir, "agent")
	}
	return o
}

func parseLabels(s string) (map[string]string, error) {
	labels := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("label %q is not key=value", kv)
		}
		labels[k] = v
	}
	return labels, nil
}

func main() {
	o := parseFlags()
	if err := run(o); err != nil {
		klog.ErrorS(err, "node-agent failed")
		klog.Flush()
		os.Exit(1)
	}
}

func run(o options) error {
	if o.nodeName == "" {
		return fmt.Errorf("--node-name is required")
	}
	labels, err := parseLabels(o.labels)
	if err != nil {
		return err
	}
	capacity := map[string]resource.Quantity{}
	for name, value := range map[string]string{"cpu": o.cpu, "memory": o.memory, "pods": o.pods} {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			return fmt.Errorf("--%s: %w", name, err)
		}
		capacity[name] = q
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	cfg.UserAgent = "patchbay-node-agent/" + o.nodeName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	registryDir := filepath.Join(o.rootDir, "plugins_registry")
	for _, dir := range []string{registryDir, filepath.Join(o.rootDir, "plugins"), o.stateDir, filepath.Join(o.stateDir, "pods")} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return err
		}
	}

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	logger := klog.FromContext(ctx)
	ctx = klog.NewContext(ctx, logger)

	node := newNodeKeeper(client, o.nodeName, labels, capacity)
	if err := node.register(ctx); err != nil {
		return fmt.Errorf("register node: %w", err)
	}
	go node.run(ctx)

	manager, err := dra.NewManager(logger, client, o.rootDir)
	if err != nil {
		return fmt.Errorf("DRA manager: %w", err)
	}
	// The kubelet's own event recorder (cmd/kubelet/app/server.go): core/v1
	// Events from source component "kubelet" on this host, deduplicated and
	// rate-limited by client-go's correlator.
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, v1.EventSource{Component: "kubelet", Host: o.nodeName})
	pods, err := newPodWorker(client, o.nodeName, manager, recorder, o.stateDir, o.cdiRoot)
	if err != nil {
		return err
	}
	sourcesReady := config.NewSourcesReady(func(sets.Set[string]) bool { return pods.synced() })
	if err := manager.Start(ctx, pods.activePods, node.get, sourcesReady); err != nil {
		return fmt.Errorf("start DRA manager: %w", err)
	}
	defer manager.Stop()
	go pods.followHealth(ctx, manager.Updates())
	// The watcher handler exists only after Start (it needs Start's context).
	plugins := pluginmanager.NewPluginManager(registryDir, &record.FakeRecorder{})
	plugins.AddHandler(registerapi.DRAPlugin, manager.GetWatcherHandler())
	go plugins.Run(ctx, sourcesReady, ctx.Done())

	klog.InfoS("node agent running", "node", o.nodeName, "registry", registryDir, "cdiRoot", o.cdiRoot)
	pods.run(ctx)
	klog.InfoS("node agent stopping")
	return nil
}
