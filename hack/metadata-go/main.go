// Command metadata-go writes KEP-5304 device metadata files with the Go
// library itself (k8s.io/dynamic-resource-allocation, kubeletplugin), so
// tests/unit/test_metadata_go.py can compare patchbay's files with them.
//
// It starts the library's Helper with device metadata on (versions v1beta1
// and v1alpha1, newest first), a fake clientset holding the claim, and a
// DRAPlugin that returns the devices of the input; then it calls
// NodePrepareResources over the plugin's socket, as the kubelet would.
//
// Usage: metadata-go <input.json> <outdir>. The input is
// {"claim": <ResourceClaim>, "devices": [{"requests", "pool", "device",
// "cdiDeviceIDs", "attributes", "networkData"}]}. Written: <outdir>/plugin
// (the library's metadata files), <outdir>/cdi (its CDI specs) and
// <outdir>/response.json (the NodePrepareResources answer).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	metadatav1alpha1 "k8s.io/dynamic-resource-allocation/api/metadata/v1alpha1"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

type inputDevice struct {
	Requests     []string                               `json:"requests"`
	Pool         string                                 `json:"pool"`
	Device       string                                 `json:"device"`
	CDIDeviceIDs []string                               `json:"cdiDeviceIDs"`
	Attributes   map[string]resourceapi.DeviceAttribute `json:"attributes"`
	NetworkData  *resourceapi.NetworkDeviceData         `json:"networkData"`
}

type input struct {
	Claim   resourceapi.ResourceClaim `json:"claim"`
	Devices []inputDevice             `json:"devices"`
}

// plugin prepares the input's claim with the input's devices.
type plugin struct{ in input }

func (p *plugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var devices []kubeletplugin.Device
		for _, d := range p.in.Devices {
			devices = append(devices, kubeletplugin.Device{
				Requests:     d.Requests,
				PoolName:     d.Pool,
				DeviceName:   d.Device,
				CDIDeviceIDs: d.CDIDeviceIDs,
				Metadata:     &kubeletplugin.DeviceMetadata{Attributes: d.Attributes, NetworkData: d.NetworkData},
			})
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devices}
	}
	return out, nil
}

func (p *plugin) UnprepareResourceClaims(context.Context, []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	return nil, nil
}

func (p *plugin) HandleError(context.Context, error, string) {}

func (p *plugin) WatchHealthStatus(ctx context.Context, _ chan<- kubeletplugin.DeviceHealthReport) error {
	<-ctx.Done()
	return nil
}

func run(inPath, outDir string) error {
	raw, err := os.ReadFile(inPath)
	if err != nil {
		return err
	}
	var in input
	if err := json.Unmarshal(raw, &in); err != nil {
		return fmt.Errorf("input: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	client := fake.NewClientset(&in.Claim)
	pluginDir, cdiDir := filepath.Join(outDir, "plugin"), filepath.Join(outDir, "cdi")
	if err := os.MkdirAll(pluginDir, 0o755); err != nil {
		return err
	}
	helper, err := kubeletplugin.Start(ctx, &plugin{in},
		kubeletplugin.DriverName("patchbay.dev"),
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName("node"),
		kubeletplugin.PluginDataDirectoryPath(pluginDir),
		kubeletplugin.RegistrationService(false),
		kubeletplugin.HealthService(false),
		kubeletplugin.CDIDirectory(cdiDir),
		kubeletplugin.EnableDeviceMetadata(true, []schema.GroupVersion{
			metadatav1beta1.SchemeGroupVersion, metadatav1alpha1.SchemeGroupVersion,
		}),
	)
	if err != nil {
		return fmt.Errorf("start helper: %w", err)
	}
	defer helper.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	resp, err := drapbv1.NewDRAPluginClient(conn).NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{
		Claims: []*drapbv1.Claim{{Namespace: in.Claim.Namespace, Name: in.Claim.Name, Uid: string(in.Claim.UID)}},
	})
	if err != nil {
		return fmt.Errorf("NodePrepareResources: %w", err)
	}
	data, err := json.MarshalIndent(resp, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, "response.json"), data, 0o644)
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: metadata-go <input.json> <outdir>")
		os.Exit(2)
	}
	if err := run(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintln(os.Stderr, "metadata-go:", err)
		os.Exit(1)
	}
}
