package main

// Container device resolution with the upstream CDI library (the code
// containerd and CRI-O use): each container's CDI device IDs, as the DRA
// manager hands them to the runtime, are injected into an OCI runtime spec.
// An ID that does not resolve, or a spec the library rejects, is an error the
// pod fails with. The result is written as a per-pod JSON record for tests.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	v1 "k8s.io/api/core/v1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type containerRecord struct {
	CDIDevices  []string            `json:"cdiDevices"`
	DeviceNodes []specs.LinuxDevice `json:"deviceNodes"`
	Env         []string            `json:"env"`
	Mounts      []specs.Mount       `json:"mounts"`
	Hooks       *specs.Hooks        `json:"hooks,omitempty"`
}

type podRecord struct {
	Namespace  string                     `json:"namespace"`
	Name       string                     `json:"name"`
	UID        string                     `json:"uid"`
	Node       string                     `json:"node"`
	Containers map[string]containerRecord `json:"containers"`
}

type cdiResolver struct {
	mu    sync.Mutex
	cache *cdi.Cache
}

func newCDIResolver(root string) (*cdiResolver, error) {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return nil, err
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(root), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("CDI cache for %s: %w", root, err)
	}
	return &cdiResolver{cache: cache}, nil
}

// resolve injects `ids` into an empty OCI spec, as a runtime would.
func (r *cdiResolver) resolve(ids []string) (containerRecord, error) {
	if ids == nil {
		ids = []string{}
	}
	rec := containerRecord{CDIDevices: ids, DeviceNodes: []specs.LinuxDevice{}, Env: []string{}, Mounts: []specs.Mount{}}
	if len(ids) == 0 {
		return rec, nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Refresh reports broken spec files (kept in GetErrors) but loads the good ones.
	_ = r.cache.Refresh()
	spec := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	unresolved, err := r.cache.InjectDevices(spec, ids...)
	if err != nil {
		return rec, fmt.Errorf("CDI injection of %s failed: %w%s", strings.Join(ids, ","), err, r.specErrors())
	}
	if len(unresolved) > 0 {
		return rec, fmt.Errorf("unresolvable CDI devices %s%s", strings.Join(unresolved, ","), r.specErrors())
	}
	if spec.Linux.Devices != nil {
		rec.DeviceNodes = spec.Linux.Devices
	}
	if spec.Process.Env != nil {
		rec.Env = spec.Process.Env
	}
	if spec.Mounts != nil {
		rec.Mounts = spec.Mounts
	}
	rec.Hooks = spec.Hooks
	return rec, nil
}

func (r *cdiResolver) specErrors() string {
	errs := r.cache.GetErrors()
	if len(errs) == 0 {
		return ""
	}
	var parts []string
	for path, list := range errs {
		for _, e := range list {
			parts = append(parts, fmt.Sprintf("%s: %v", path, e))
		}
	}
	sort.Strings(parts)
	return " (CDI spec errors: " + strings.Join(parts, "; ") + ")"
}

func recordPath(stateDir string, pod *v1.Pod) string {
	return filepath.Join(stateDir, "pods", pod.Namespace+"_"+pod.Name+".json")
}

// writeRecord writes the record atomically (temp file + rename).
func writeRecord(stateDir string, pod *v1.Pod, rec *podRecord) error {
	data, err := json.MarshalIndent(rec, "", "  ")
	if err != nil {
		return err
	}
	path := recordPath(stateDir, pod)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// removeRecord removes the pod's record unless it belongs to a newer pod of
// the same name.
func removeRecord(stateDir string, pod *v1.Pod) error {
	path := recordPath(stateDir, pod)
	data, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var rec podRecord
	if json.Unmarshal(data, &rec) == nil && rec.UID != "" && rec.UID != string(pod.UID) {
		return nil
	}
	err = os.Remove(path)
	if os.IsNotExist(err) {
		return nil
	}
	return err
}
