// dra-cel evaluates CEL selectors against ResourceSlice devices with the
// scheduler's own CEL library (k8s.io/dynamic-resource-allocation/cel,
// v0.37.2), so unit tests can check that DeviceClasses and claim examples
// still select the devices our slices publish (issue 26, leaner slices).
//
// Input (stdin, JSON): {"driver": "...", "expressions": ["..."],
// "devices": [<ResourceSlice.spec.devices entries>]}. Output (stdout, JSON):
// one row per expression, one cell per device: "true", "false", or
// "error: <message>" (a runtime error fails the scheduler's allocation), or
// {"compile": "<message>"} for an expression that does not compile.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
)

type input struct {
	Driver      string               `json:"driver"`
	Expressions []string             `json:"expressions"`
	Devices     []resourceapi.Device `json:"devices"`
}

type row struct {
	Compile string   `json:"compile,omitempty"`
	Cells   []string `json:"cells,omitempty"`
}

func main() {
	var in input
	if err := json.NewDecoder(os.Stdin).Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "dra-cel: bad input:", err)
		os.Exit(2)
	}
	// As the 1.37 scheduler compiles selectors with its default gates.
	cache := cel.NewCache(100, cel.Features{EnableConsumableCapacity: true})
	out := make([]row, 0, len(in.Expressions))
	for _, expr := range in.Expressions {
		compiled := cache.GetOrCompile(expr)
		if compiled.Error != nil {
			out = append(out, row{Compile: compiled.Error.Error()})
			continue
		}
		r := row{Cells: make([]string, 0, len(in.Devices))}
		for _, d := range in.Devices {
			ok, _, err := compiled.DeviceMatches(context.Background(), cel.Device{
				Driver:                   in.Driver,
				AllowMultipleAllocations: d.AllowMultipleAllocations,
				Attributes:               d.Attributes,
				Capacity:                 d.Capacity,
			})
			switch {
			case err != nil:
				r.Cells = append(r.Cells, "error: "+err.Error())
			case ok:
				r.Cells = append(r.Cells, "true")
			default:
				r.Cells = append(r.Cells, "false")
			}
		}
		out = append(out, r)
	}
	if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
		fmt.Fprintln(os.Stderr, "dra-cel:", err)
		os.Exit(1)
	}
}
