// alloc-oracle runs the Kubernetes structured allocator
// (k8s.io/dynamic-resource-allocation/structured, with the feature set
// Kubernetes 1.36 enables by default) on the objects in files, and prints
// what it decided in the format `switchyard dra allocate -o json` prints.
// It is the reference the Rust allocator in libs/dra is tested and measured
// against.
//
//	alloc-oracle allocate --node NODE FILE...   one case, files of YAML or JSON objects
//	alloc-oracle batch                          one case per stdin line: {"node": "...", "objects": [...]}
//	alloc-oracle bench FILE...                  the load: see bench()
//
// Claims with status.allocation count as allocated; the others are allocated
// together, in file order, as the scheduler does for one pod. Nodes may be
// given as Node objects (for their labels); a node not given is a bare Node.
// API defaults are applied to requests (allocationMode ExactCount, count 1).
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"time"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
)

var features = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

type objects struct {
	slices  []*resourceapi.ResourceSlice
	classes map[string]*resourceapi.DeviceClass
	claims  []*resourceapi.ResourceClaim
	nodes   map[string]*v1.Node
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	// The scheduler's informer lister words it this way.
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclass"), name)
}

func decode(raw []json.RawMessage) (*objects, error) {
	o := &objects{classes: map[string]*resourceapi.DeviceClass{}, nodes: map[string]*v1.Node{}}
	for i, doc := range raw {
		var meta metav1.TypeMeta
		if err := json.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("object #%d: %w", i, err)
		}
		switch meta.Kind {
		case "ResourceSlice":
			s := &resourceapi.ResourceSlice{}
			if err := json.Unmarshal(doc, s); err != nil {
				return nil, fmt.Errorf("object #%d: %w", i, err)
			}
			o.slices = append(o.slices, s)
		case "DeviceClass":
			c := &resourceapi.DeviceClass{}
			if err := json.Unmarshal(doc, c); err != nil {
				return nil, fmt.Errorf("object #%d: %w", i, err)
			}
			o.classes[c.Name] = c
		case "ResourceClaim":
			c := &resourceapi.ResourceClaim{}
			if err := json.Unmarshal(doc, c); err != nil {
				return nil, fmt.Errorf("object #%d: %w", i, err)
			}
			defaults(c)
			o.claims = append(o.claims, c)
		case "Node":
			n := &v1.Node{}
			if err := json.Unmarshal(doc, n); err != nil {
				return nil, fmt.Errorf("object #%d: %w", i, err)
			}
			o.nodes[n.Name] = n
		case "":
			return nil, fmt.Errorf("object #%d: no kind", i)
		}
	}
	return o, nil
}

func defaults(c *resourceapi.ResourceClaim) {
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		if r.Exactly != nil {
			if r.Exactly.AllocationMode == "" {
				r.Exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeExactCount && r.Exactly.Count == 0 {
				r.Exactly.Count = 1
			}
		}
		for j := range r.FirstAvailable {
			s := &r.FirstAvailable[j]
			if s.AllocationMode == "" {
				s.AllocationMode = resourceapi.DeviceAllocationModeExactCount
			}
			if s.AllocationMode == resourceapi.DeviceAllocationModeExactCount && s.Count == 0 {
				s.Count = 1
			}
		}
	}
}

// allocatedState is what the scheduler gathers from allocated claims.
func allocatedState(claims []*resourceapi.ResourceClaim) structured.AllocatedState {
	state := structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	for _, c := range claims {
		addAllocated(&state, c)
	}
	return state
}

func addAllocated(state *structured.AllocatedState, c *resourceapi.ResourceClaim) {
	if c.Status.Allocation == nil {
		return
	}
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.AdminAccess != nil && *r.AdminAccess {
			continue
		}
		id := structured.MakeDeviceID(r.Driver, r.Pool, r.Device)
		if r.ShareID != nil {
			state.AllocatedSharedDeviceIDs.Insert(structured.MakeSharedDeviceID(id, r.ShareID))
			if r.ConsumedCapacity != nil {
				state.AggregatedCapacity.Insert(structured.NewDeviceConsumedCapacity(id, r.ConsumedCapacity))
			}
			continue
		}
		state.AllocatedDevices.Insert(id)
	}
}

type allocation struct {
	Claim      string                       `json:"claim"`
	Allocation resourceapi.AllocationResult `json:"allocation"`
}

type output struct {
	Node        string       `json:"node"`
	Result      string       `json:"result"`
	Allocations []allocation `json:"allocations"`
	Error       string       `json:"error,omitempty"`
}

func claimName(c *resourceapi.ResourceClaim) string {
	if c.Namespace != "" {
		return c.Namespace + "/" + c.Name
	}
	return c.Name
}

func run(ctx context.Context, o *objects, nodeName string, cache *cel.Cache) output {
	out := output{Node: nodeName, Allocations: []allocation{}}
	var pending, allocated []*resourceapi.ResourceClaim
	for _, c := range o.claims {
		if c.Status.Allocation != nil {
			allocated = append(allocated, c)
		} else {
			pending = append(pending, c)
		}
	}
	node := o.nodes[nodeName]
	if node == nil {
		node = &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
	}
	allocator, err := structured.NewAllocator(ctx, features, allocatedState(allocated), classLister(o.classes), o.slices, cache)
	if err != nil {
		out.Result, out.Error = "error", err.Error()
		return out
	}
	results, err := allocator.Allocate(ctx, node, pending)
	switch {
	case errors.Is(err, structured.ErrFailedAllocationOnNode):
		out.Result, out.Error = "unschedulable", err.Error()
	case err != nil:
		out.Result, out.Error = "error", err.Error()
	case results == nil:
		out.Result = "unschedulable"
	default:
		out.Result = "allocated"
		for i, r := range results {
			out.Allocations = append(out.Allocations, allocation{Claim: claimName(pending[i]), Allocation: r})
		}
	}
	return out
}

func readFiles(paths []string) ([]json.RawMessage, error) {
	var raw []json.RawMessage
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		d := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var doc json.RawMessage
			if err := d.Decode(&doc); err == io.EOF {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 || string(doc) == "null" {
				continue
			}
			// A List is flattened into its items.
			var list struct {
				Kind  string            `json:"kind"`
				Items []json.RawMessage `json:"items"`
			}
			if json.Unmarshal(doc, &list) == nil && list.Kind == "List" {
				raw = append(raw, list.Items...)
				continue
			}
			raw = append(raw, doc)
		}
	}
	return raw, nil
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "alloc-oracle:", err)
	os.Exit(2)
}

func main() {
	if len(os.Args) < 2 {
		fail(errors.New("usage: alloc-oracle allocate --node NODE FILE... | batch | bench FILE..."))
	}
	ctx := context.Background()
	cache := cel.NewCache(1000, cel.Features{EnableConsumableCapacity: true})
	enc := json.NewEncoder(os.Stdout)
	switch os.Args[1] {
	case "allocate":
		args := os.Args[2:]
		if len(args) < 3 || args[0] != "--node" {
			fail(errors.New("usage: alloc-oracle allocate --node NODE FILE..."))
		}
		raw, err := readFiles(args[2:])
		if err != nil {
			fail(err)
		}
		o, err := decode(raw)
		if err != nil {
			fail(err)
		}
		_ = enc.Encode(run(ctx, o, args[1], cache))
	case "batch":
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 64<<20), 64<<20)
		out := bufio.NewWriter(os.Stdout)
		defer out.Flush()
		enc := json.NewEncoder(out)
		for in.Scan() {
			var c struct {
				Node    string            `json:"node"`
				Objects []json.RawMessage `json:"objects"`
			}
			if err := json.Unmarshal(in.Bytes(), &c); err != nil {
				fail(err)
			}
			o, err := decode(c.Objects)
			if err != nil {
				_ = enc.Encode(output{Node: c.Node, Result: "error", Error: err.Error(), Allocations: []allocation{}})
				continue
			}
			_ = enc.Encode(run(ctx, o, c.Node, cache))
		}
		if err := in.Err(); err != nil {
			fail(err)
		}
	case "bench":
		raw, err := readFiles(os.Args[2:])
		if err != nil {
			fail(err)
		}
		o, err := decode(raw)
		if err != nil {
			fail(err)
		}
		bench(ctx, o, cache)
	default:
		fail(fmt.Errorf("unknown mode %q", os.Args[1]))
	}
}

// bench allocates every pending claim, one at a time in file order, on the
// nodes (sorted by name) starting at claim index modulo the node count and
// moving on while a node answers unschedulable — as a scheduler cycle per
// claim would — each on top of what was allocated before. It prints the
// number allocated, the elapsed time and a digest of the decisions.
func bench(ctx context.Context, o *objects, cache *cel.Cache) {
	var names []string
	for n := range o.nodes {
		names = append(names, n)
	}
	sort.Strings(names)
	var pending []*resourceapi.ResourceClaim
	var done []*resourceapi.ResourceClaim
	for _, c := range o.claims {
		if c.Status.Allocation == nil {
			pending = append(pending, c)
		} else {
			done = append(done, c)
		}
	}
	state := allocatedState(done)
	digest := sha256.New()
	allocatedCount, attempts := 0, 0
	start := time.Now()
	for i, claim := range pending {
		for k := 0; k < len(names); k++ {
			node := o.nodes[names[(i+k)%len(names)]]
			allocator, err := structured.NewAllocator(ctx, features, state, classLister(o.classes), o.slices, cache)
			if err != nil {
				fail(err)
			}
			attempts++
			results, err := allocator.Allocate(ctx, node, []*resourceapi.ResourceClaim{claim})
			if err != nil && !errors.Is(err, structured.ErrFailedAllocationOnNode) {
				fail(err)
			}
			if results == nil {
				continue
			}
			c := claim.DeepCopy()
			c.Status.Allocation = &results[0]
			addAllocated(&state, c)
			allocatedCount++
			for _, r := range results[0].Devices.Results {
				fmt.Fprintf(digest, "%s %s %s/%s/%s\n", claimName(claim), node.Name, r.Driver, r.Pool, r.Device)
			}
			break
		}
	}
	elapsed := time.Since(start)
	fmt.Printf("{\"claims\":%d,\"allocated\":%d,\"attempts\":%d,\"seconds\":%s,\"digest\":\"%x\"}\n",
		len(pending), allocatedCount, attempts, strconv.FormatFloat(elapsed.Seconds(), 'f', 6, 64), digest.Sum(nil))
}
