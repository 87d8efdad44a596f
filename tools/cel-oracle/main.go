// cel-oracle evaluates DRA device selectors as Kubernetes does
// (k8s.io/dynamic-resource-allocation/cel, the compiler the scheduler uses),
// one JSON request per line of stdin:
//
//	{"expr": "...", "device": {"driver": "...", "allowMultipleAllocations": false,
//	  "attributes": {"<name>": {"int": 1} | {"bool": true} | {"string": "s"} | {"version": "1.2.3"}},
//	  "capacity": {"<name>": "40Gi"}}}
//
// and answers one JSON line: {"compileError": "..."}, {"error": "..."} or {"result": true|false},
// the latter two with "maxCost": the worst-case cost estimate the API server
// compares with CELSelectorExpressionMaxCost.
// The reference the Rust implementation in libs/dra is tested against.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
)

type attribute struct {
	Int     *int64  `json:"int,omitempty"`
	Bool    *bool   `json:"bool,omitempty"`
	String  *string `json:"string,omitempty"`
	Version *string `json:"version,omitempty"`
}

type request struct {
	Expr   string `json:"expr"`
	Device struct {
		Driver                   string               `json:"driver"`
		AllowMultipleAllocations bool                 `json:"allowMultipleAllocations"`
		Attributes               map[string]attribute `json:"attributes"`
		Capacity                 map[string]string    `json:"capacity"`
	} `json:"device"`
}

type answer struct {
	CompileError *string `json:"compileError,omitempty"`
	Error        *string `json:"error,omitempty"`
	Result       *bool   `json:"result,omitempty"`
	// The worst-case cost the API server compares with
	// CELSelectorExpressionMaxCost (set whenever the expression compiles).
	MaxCost *uint64 `json:"maxCost,omitempty"`
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	compiler := cel.GetCompiler(cel.Features{EnableConsumableCapacity: true})
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			msg := fmt.Sprintf("bad request: %v", err)
			_ = enc.Encode(answer{Error: &msg})
			continue
		}
		_ = enc.Encode(evaluate(compiler, req))
	}
}

func evaluate(compiler interface {
	CompileCELExpression(string, cel.Options) cel.CompilationResult
}, req request) answer {
	result := compiler.CompileCELExpression(req.Expr, cel.Options{})
	if result.Error != nil {
		msg := result.Error.Error()
		return answer{CompileError: &msg}
	}
	a := evaluateDevice(result, req)
	maxCost := result.MaxCost
	a.MaxCost = &maxCost
	return a
}

func evaluateDevice(result cel.CompilationResult, req request) answer {
	device := cel.Device{
		Driver:                   req.Device.Driver,
		AllowMultipleAllocations: &req.Device.AllowMultipleAllocations,
		Attributes:               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{},
		Capacity:                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{},
	}
	for name, a := range req.Device.Attributes {
		device.Attributes[resourceapi.QualifiedName(name)] = resourceapi.DeviceAttribute{
			IntValue: a.Int, BoolValue: a.Bool, StringValue: a.String, VersionValue: a.Version,
		}
	}
	for name, value := range req.Device.Capacity {
		q, err := resource.ParseQuantity(value)
		if err != nil {
			msg := fmt.Sprintf("bad capacity %s: %v", name, err)
			return answer{Error: &msg}
		}
		device.Capacity[resourceapi.QualifiedName(name)] = resourceapi.DeviceCapacity{Value: q}
	}
	matches, _, err := result.DeviceMatches(context.Background(), device)
	if err != nil {
		msg := err.Error()
		return answer{Error: &msg}
	}
	return answer{Result: &matches}
}
