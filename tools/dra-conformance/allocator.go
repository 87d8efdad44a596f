package main

import (
	"context"
	"errors"
	"os"
	"sort"
	"sync"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/dynamic-resource-allocation/structured/internal"
	"k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// defaults136 is the feature set Kubernetes 1.36 enables by default (as
// tools/alloc-oracle uses it): everything but DRAListTypeAttributes (alpha).
var defaults136 = structured.Features{
	AdminAccess:            true,
	ConsumableCapacity:     true,
	DeviceBindingAndStatus: true,
	DeviceTaints:           true,
	PartitionableDevices:   true,
	PrioritizedList:        true,
}

// allocatorCase is one case of the table as the allocator saw it.
type allocatorCase struct {
	// The subtest's name, e.g. "TestAllocator/simple".
	Name string `json:"name"`
	// The features the table runs the case with.
	Features  internal.Features            `json:"features"`
	Node      *v1.Node                     `json:"node"`
	Classes   []*resourceapi.DeviceClass   `json:"classes"`
	Slices    []*resourceapi.ResourceSlice `json:"slices"`
	Claims    []*resourceapi.ResourceClaim `json:"claims"`
	Allocated allocated                    `json:"allocated"`
	// The context was cancelled or past its deadline when Allocate returned
	// (the "interrupt" cases).
	Interrupted bool `json:"interrupted,omitempty"`
	// What the allocator chosen for Features answered: what the table checks.
	Table outcome `json:"table"`
	// Whether the table's own checks held (the subtest passed).
	TablePassed bool `json:"tablePassed"`
	// What the allocator answers for the same inputs with Kubernetes 1.36's
	// default features, on an uncancelled context.
	Kubernetes outcome `json:"kubernetes"`
}

// allocated is the AllocatedState a case starts from.
type allocated struct {
	// Devices allocated exclusively.
	Devices []deviceRef `json:"devices"`
	// Devices allocated with a share ID.
	Shared []deviceRef `json:"shared"`
	// Capacity consumed on shared devices, per device.
	Capacity []deviceRef `json:"capacity"`
}

type deviceRef struct {
	Driver   string            `json:"driver"`
	Pool     string            `json:"pool"`
	Device   string            `json:"device"`
	ShareID  string            `json:"shareID,omitempty"`
	Consumed map[string]string `json:"consumed,omitempty"`
}

// outcome is what Allocate decided, in the shape `switchyard dra allocate
// -o json` and tools/alloc-oracle print.
type outcome struct {
	Node        string       `json:"node"`
	Result      string       `json:"result"`
	Allocations []allocation `json:"allocations"`
	Error       string       `json:"error,omitempty"`
}

type allocation struct {
	Claim      string                       `json:"claim"`
	Allocation resourceapi.AllocationResult `json:"allocation"`
}

func outcomeOf(node *v1.Node, claims []*resourceapi.ResourceClaim, results []resourceapi.AllocationResult, err error) outcome {
	out := outcome{Node: node.Name, Allocations: []allocation{}}
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
			out.Allocations = append(out.Allocations, allocation{Claim: claims[i].Name, Allocation: r})
		}
	}
	return out
}

func allocatedOf(state internal.AllocatedState) allocated {
	ref := func(id internal.DeviceID) deviceRef {
		return deviceRef{Driver: id.Driver.String(), Pool: id.Pool.String(), Device: id.Device.String()}
	}
	a := allocated{Devices: []deviceRef{}, Shared: []deviceRef{}, Capacity: []deviceRef{}}
	for id := range state.AllocatedDevices {
		a.Devices = append(a.Devices, ref(id))
	}
	for id := range state.AllocatedSharedDeviceIDs {
		r := ref(id.GetDeviceID())
		r.ShareID = id.ShareID.String()
		a.Shared = append(a.Shared, r)
	}
	for id, consumed := range state.AggregatedCapacity {
		r := ref(id)
		r.Consumed = map[string]string{}
		for name, q := range consumed {
			if q != nil {
				r.Consumed[string(name)] = q.String()
			}
		}
		a.Capacity = append(a.Capacity, r)
	}
	// Sets and maps have no order; the records should.
	for _, refs := range [][]deviceRef{a.Devices, a.Shared, a.Capacity} {
		sort.Slice(refs, func(i, j int) bool {
			x, y := refs[i], refs[j]
			return x.Driver+"/"+x.Pool+"/"+x.Device+"/"+x.ShareID < y.Driver+"/"+y.Pool+"/"+y.Device+"/"+y.ShareID
		})
	}
	return a
}

// recorder is what the table's harness tests: Kubernetes' own allocator for
// the case's features, recording its inputs and answers on the way.
type recorder struct {
	inner    internal.Allocator
	record   *allocatorCase
	state    internal.AllocatedState
	lister   internal.DeviceClassLister
	slices   []*resourceapi.ResourceSlice
	failures *[]error
}

func (r *recorder) Channel() internal.AllocatorChannel { return r.inner.Channel() }

func (r *recorder) Allocate(ctx context.Context, node *v1.Node, claims []*resourceapi.ResourceClaim) ([]resourceapi.AllocationResult, error) {
	r.record.Node = node.DeepCopy()
	for _, c := range claims {
		r.record.Claims = append(r.record.Claims, c.DeepCopy())
	}
	results, err := r.inner.Allocate(ctx, node, claims)
	r.record.Interrupted = ctx.Err() != nil
	r.record.Table = outcomeOf(node, claims, results, err)

	// The same question with 1.36's features, on a fresh allocator (an
	// allocator may keep state between calls).
	cache := cel.NewCache(1, cel.Features{EnableConsumableCapacity: true})
	allocator, err136 := structured.NewAllocator(context.Background(), defaults136, r.state, r.lister, r.slices, cache)
	if err136 != nil {
		*r.failures = append(*r.failures, err136)
	} else {
		results136, err136 := allocator.Allocate(context.Background(), node, claims)
		r.record.Kubernetes = outcomeOf(node, claims, results136, err136)
	}
	return results, err
}

// recorderWithStats is a recorder for an allocator that keeps statistics:
// the table checks them where an allocator offers them.
type recorderWithStats struct{ *recorder }

func (r recorderWithStats) GetStats() internal.Stats {
	return r.inner.(internal.AllocatorExtended).GetStats()
}

// testOf is the subtest a harness context belongs to: ktesting's logger
// knows it.
func testOf(ctx context.Context) *testing.T {
	if u, ok := klog.FromContext(ctx).GetSink().(ktesting.Underlier); ok {
		if t, ok := u.GetUnderlying().(*testing.T); ok {
			return t
		}
	}
	return nil
}

// runAllocatorTable runs the table's harness (with every feature the table
// knows, so that no case is skipped), with recorders as the allocator, and
// prints one record per case. The testing package's own report goes to
// stderr; the exit code is the testing package's (1 if a case of the table
// failed, which the records say case by case as well).
func runAllocatorTable() {
	records := os.Stdout
	os.Stdout = os.Stderr
	// The testing package reads its flags from the command line.
	os.Args = os.Args[:1]
	// Each case runs on the first of these whose features cover the case's:
	// incubating, the variant Kubernetes 1.36 runs, then experimental (for
	// DRAListTypeAttributes). The stable variant is left out: it is not the
	// one 1.36 uses, and upstream runs only part of the table on it.
	structured.EnableAllocators("incubating", "experimental")
	var mu sync.Mutex
	var cases []*allocatorCase
	var failures []error
	newAllocator := func(
		ctx context.Context,
		features internal.Features,
		state internal.AllocatedState,
		lister internal.DeviceClassLister,
		slices []*resourceapi.ResourceSlice,
		cache *cel.Cache,
	) (internal.Allocator, error) {
		t := testOf(ctx)
		if t == nil {
			return nil, errors.New("dra-conformance: the harness's context names no test")
		}
		classes, err := lister.List()
		if err != nil {
			return nil, err
		}
		record := &allocatorCase{
			Name:      t.Name(),
			Features:  features,
			Allocated: allocatedOf(state),
			Slices:    slices,
			Claims:    []*resourceapi.ResourceClaim{},
		}
		for _, c := range classes {
			record.Classes = append(record.Classes, c.DeepCopy())
		}
		t.Cleanup(func() {
			record.TablePassed = !t.Failed()
			mu.Lock()
			defer mu.Unlock()
			cases = append(cases, record)
		})
		inner, err := structured.NewAllocator(ctx, features, state, lister, slices, cache)
		if err != nil {
			return nil, err
		}
		r := &recorder{inner: inner.(internal.Allocator), record: record, state: state, lister: lister, slices: slices, failures: &failures}
		if _, ok := inner.(internal.AllocatorExtended); ok {
			return recorderWithStats{r}, nil
		}
		return r, nil
	}
	all := internal.FeaturesAll
	testing.Main(
		func(string, string) (bool, error) { return true, nil },
		[]testing.InternalTest{
			{Name: "TestAllocator", F: func(t *testing.T) {
				allocatortesting.TestAllocator(t, all, newAllocator)
			}},
			{Name: "TestLexicographicalAllocator", F: func(t *testing.T) {
				allocatortesting.TestLexicographicalAllocator(t, all, newAllocator)
			}},
			{Name: "Records", F: func(t *testing.T) {
				for _, err := range failures {
					t.Errorf("the 1.36 allocator: %v", err)
				}
				sort.Slice(cases, func(i, j int) bool { return cases[i].Name < cases[j].Name })
				if err := writeLines(records, cases); err != nil {
					t.Fatal(err)
				}
			}},
		},
		nil, nil,
	)
}
