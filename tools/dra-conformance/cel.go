package main

import (
	"context"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/dynamic-resource-allocation/cel"
)

const draModule = "k8s.io/dynamic-resource-allocation"

// celCase is one run of a case of the CEL table: upstream runs a case once
// per setting of DRAListTypeAttributes it names, both when it names none.
type celCase struct {
	// Upstream's subtest name: "<case>-list-type-attributes-<bool>", or the
	// case's name alone when the case could not be read.
	Name string `json:"name"`
	// Why the case could not be read as Go literals (it is built by code).
	Unreadable string `json:"unreadable,omitempty"`
	// The table's settings: the CEL environment (StoredExpressions, the
	// scheduler's, unless NewExpressions, the API server's for new objects)
	// and the two feature gates.
	EnvType            environment.Type `json:"envType,omitempty"`
	ConsumableCapacity bool             `json:"consumableCapacity"`
	ListTypeAttributes bool             `json:"listTypeAttributes"`
	Expression         string           `json:"expression,omitempty"`
	Device             *celDevice       `json:"device,omitempty"`
	// What the table expects: a compile error or an evaluation error
	// containing these words, else the match; and the worst-case cost.
	ExpectCompileError string `json:"expectCompileError,omitempty"`
	ExpectMatchError   string `json:"expectMatchError,omitempty"`
	ExpectMatch        bool   `json:"expectMatch"`
	ExpectCost         uint64 `json:"expectCost"`
	// Whether Kubernetes, with the table's settings, meets the table's
	// expectations (as TestCEL checks them), and if not, how it fails.
	TableHolds   bool   `json:"tableHolds"`
	TableFailure string `json:"tableFailure,omitempty"`
	// What Kubernetes 1.36's scheduler answers: StoredExpressions,
	// DRAConsumableCapacity on, DRAListTypeAttributes off.
	Kubernetes *celAnswer `json:"kubernetes,omitempty"`
}

// celDevice is a device as the cel-oracle's requests give it.
type celDevice struct {
	Driver                   string                                                    `json:"driver"`
	AllowMultipleAllocations *bool                                                     `json:"allowMultipleAllocations"`
	Attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute `json:"attributes"`
	Capacity                 map[resourceapi.QualifiedName]string                      `json:"capacity"`
}

// celAnswer is the cel-oracle's answer shape.
type celAnswer struct {
	CompileError *string `json:"compileError,omitempty"`
	Error        *string `json:"error,omitempty"`
	Result       *bool   `json:"result,omitempty"`
	MaxCost      *uint64 `json:"maxCost,omitempty"`
}

// celScenario is one entry of the table, read.
type celScenario struct {
	envType                  *environment.Type
	enableConsumableCapacity bool
	enableListTypeAttributes *bool
	expression               string
	driver                   string
	allowMultipleAllocations *bool
	attributes               map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	capacity                 map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	expectCompileError       string
	expectMatchError         string
	expectMatch              bool
	expectCost               uint64
}

// moduleFile is a file of the dynamic-resource-allocation module this
// program was built with, in the Go module cache.
func moduleFile(rel string) (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", fmt.Errorf("no build information to find %s's version in", draModule)
	}
	version := ""
	for _, dep := range info.Deps {
		if dep.Path == draModule {
			version = dep.Version
		}
	}
	if version == "" {
		return "", fmt.Errorf("built without %s", draModule)
	}
	cache := os.Getenv("GOMODCACHE")
	if cache == "" {
		out, err := exec.Command("go", "env", "GOMODCACHE").Output()
		if err != nil {
			return "", fmt.Errorf("go env GOMODCACHE: %w", err)
		}
		cache = strings.TrimSpace(string(out))
	}
	// Module paths are lower case here; no case-escaping is needed.
	path := filepath.Join(cache, draModule+"@"+version, rel)
	if _, err := os.Stat(path); err != nil {
		// The cache was cleaned since this program was built: fetch the
		// module again (from the module proxy, as the build did).
		if out, err := exec.Command("go", "mod", "download", draModule+"@"+version).CombinedOutput(); err != nil {
			return "", fmt.Errorf("go mod download %s@%s: %v: %s", draModule, version, err, out)
		}
	}
	return path, nil
}

// celTable reads the testcases of cel/compile_test.go and runs each through
// Kubernetes' compiler.
func celTable(file string) ([]celCase, error) {
	if file == "" {
		var err error
		if file, err = moduleFile("cel/compile_test.go"); err != nil {
			return nil, err
		}
	}
	fset := token.NewFileSet()
	parsed, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		return nil, err
	}
	r := &reader{fset: fset, consts: map[string]ast.Expr{}}
	var table *ast.CompositeLit
	for _, decl := range parsed.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, spec := range gen.Specs {
			vs, ok := spec.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				if gen.Tok == token.CONST {
					r.consts[name.Name] = vs.Values[i]
				}
				if name.Name == "testcases" {
					table, _ = vs.Values[i].(*ast.CompositeLit)
				}
			}
		}
	}
	if table == nil {
		return nil, fmt.Errorf("%s: no composite literal named testcases", file)
	}
	var out []celCase
	for _, elt := range table.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return nil, fmt.Errorf("%s: a table entry without a name", fset.Position(elt.Pos()))
		}
		key, err := r.eval(kv.Key)
		if err != nil {
			return nil, err
		}
		name, ok := key.(string)
		if !ok {
			return nil, fmt.Errorf("%s: a table entry named by %T", fset.Position(kv.Pos()), key)
		}
		s, err := r.scenario(kv.Value)
		if err != nil {
			out = append(out, celCase{Name: name, Unreadable: err.Error()})
			continue
		}
		variants := []bool{false, true}
		if s.enableListTypeAttributes != nil {
			variants = []bool{*s.enableListTypeAttributes}
		}
		for _, listType := range variants {
			out = append(out, runCELCase(name, s, listType))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// runCELCase answers one run of a case: with the table's settings, checked
// as TestCEL checks it, and with 1.36's.
func runCELCase(name string, s *celScenario, listType bool) celCase {
	c := celCase{
		Name:               fmt.Sprintf("%s-list-type-attributes-%v", name, listType),
		EnvType:            environment.StoredExpressions,
		ConsumableCapacity: s.enableConsumableCapacity,
		ListTypeAttributes: listType,
		Expression:         s.expression,
		Device: &celDevice{
			Driver:                   s.driver,
			AllowMultipleAllocations: s.allowMultipleAllocations,
			Attributes:               s.attributes,
			Capacity:                 map[resourceapi.QualifiedName]string{},
		},
		ExpectCompileError: s.expectCompileError,
		ExpectMatchError:   s.expectMatchError,
		ExpectMatch:        s.expectMatch,
		ExpectCost:         s.expectCost,
	}
	if s.envType != nil {
		c.EnvType = *s.envType
	}
	for n, q := range s.capacity {
		c.Device.Capacity[n] = q.Value.String()
	}
	device := cel.Device{
		Driver:                   s.driver,
		AllowMultipleAllocations: s.allowMultipleAllocations,
		Attributes:               s.attributes,
		Capacity:                 s.capacity,
	}
	ctx := context.Background()

	// The table's checks (those of TestCEL on the answer).
	result := cel.GetCompiler(cel.Features{
		EnableConsumableCapacity: s.enableConsumableCapacity,
		EnableListTypeAttributes: listType,
	}).CompileCELExpression(s.expression, cel.Options{EnvType: s.envType})
	c.TableFailure = tableFailure(s, result, device)
	c.TableHolds = c.TableFailure == ""

	// 1.36's scheduler, as tools/cel-oracle answers.
	result = cel.GetCompiler(cel.Features{EnableConsumableCapacity: true}).CompileCELExpression(s.expression, cel.Options{})
	c.Kubernetes = &celAnswer{}
	if result.Error != nil {
		msg := result.Error.Error()
		c.Kubernetes.CompileError = &msg
		return c
	}
	maxCost := result.MaxCost
	c.Kubernetes.MaxCost = &maxCost
	matches, _, err := result.DeviceMatches(ctx, device)
	if err != nil {
		msg := err.Error()
		c.Kubernetes.Error = &msg
	} else {
		c.Kubernetes.Result = &matches
	}
	return c
}

// tableFailure is how the answer misses the table's expectations, in the
// order TestCEL checks them ("" when it meets them).
func tableFailure(s *celScenario, result cel.CompilationResult, device cel.Device) string {
	if result.Error != nil {
		if s.expectCompileError == "" {
			return fmt.Sprintf("unexpected compile error: %v", result.Error)
		}
		if !strings.Contains(result.Error.Error(), s.expectCompileError) {
			return fmt.Sprintf("compile error %q does not contain %q", result.Error.Error(), s.expectCompileError)
		}
		return ""
	}
	if s.expectCompileError != "" {
		return fmt.Sprintf("expected compile error %q, got none", s.expectCompileError)
	}
	if result.MaxCost != s.expectCost {
		return fmt.Sprintf("expected cost %d, got %d", s.expectCost, result.MaxCost)
	}
	matches, _, err := result.DeviceMatches(context.Background(), device)
	if err != nil {
		if s.expectMatchError == "" || !strings.Contains(err.Error(), s.expectMatchError) {
			return fmt.Sprintf("evaluation error %q, expected %q", err.Error(), s.expectMatchError)
		}
		return ""
	}
	if s.expectMatchError != "" {
		return fmt.Sprintf("expected evaluation error %q, got none", s.expectMatchError)
	}
	if matches != s.expectMatch {
		return fmt.Sprintf("expected result %v, got %v", s.expectMatch, matches)
	}
	return ""
}

// reader evaluates the Go expressions the table is written in: literals,
// constant arithmetic, ptr.To / new, conversions, resource.MustParse and
// composite literals. Anything else (a function literal building a value)
// is an error naming the expression.
type reader struct {
	fset   *token.FileSet
	consts map[string]ast.Expr
}

// pointer is the value of ptr.To(x) or new(x).
type pointer struct{ value any }

// fields is a struct literal: field name to value.
type fields map[string]any

// knownConstants are the package constants the table's arithmetic refers to.
var knownConstants = map[string]int64{
	"resourceapi.DeviceAttributeMaxValueLength":            resourceapi.DeviceAttributeMaxValueLength,
	"resourceapi.ResourceSliceMaxAttributeValuesPerDevice": resourceapi.ResourceSliceMaxAttributeValuesPerDevice,
	"resourceapi.CELSelectorExpressionMaxCost":             resourceapi.CELSelectorExpressionMaxCost,
}

func (r *reader) errorf(e ast.Node, format string, args ...any) error {
	return fmt.Errorf("%s: %s", r.fset.Position(e.Pos()), fmt.Sprintf(format, args...))
}

func (r *reader) eval(e ast.Expr) (any, error) {
	switch e := e.(type) {
	case *ast.BasicLit:
		switch e.Kind {
		case token.INT:
			return strconv.ParseInt(e.Value, 0, 64)
		case token.STRING:
			return strconv.Unquote(e.Value)
		}
	case *ast.ParenExpr:
		return r.eval(e.X)
	case *ast.Ident:
		switch e.Name {
		case "true":
			return true, nil
		case "false":
			return false, nil
		case "nil":
			return nil, nil
		}
		if c, ok := r.consts[e.Name]; ok {
			return r.eval(c)
		}
	case *ast.SelectorExpr:
		if pkg, ok := e.X.(*ast.Ident); ok {
			name := pkg.Name + "." + e.Sel.Name
			if v, ok := knownConstants[name]; ok {
				return v, nil
			}
			switch name {
			case "environment.NewExpressions":
				return environment.NewExpressions, nil
			case "environment.StoredExpressions":
				return environment.StoredExpressions, nil
			}
		}
	case *ast.BinaryExpr:
		x, err := r.eval(e.X)
		if err != nil {
			return nil, err
		}
		y, err := r.eval(e.Y)
		if err != nil {
			return nil, err
		}
		if xs, ok := x.(string); ok && e.Op == token.ADD {
			if ys, ok := y.(string); ok {
				return xs + ys, nil
			}
		}
		xi, xok := x.(int64)
		yi, yok := y.(int64)
		if xok && yok {
			switch e.Op {
			case token.ADD:
				return xi + yi, nil
			case token.SUB:
				return xi - yi, nil
			case token.MUL:
				return xi * yi, nil
			}
		}
	case *ast.CallExpr:
		return r.call(e)
	case *ast.CompositeLit:
		return r.composite(e)
	}
	return nil, r.errorf(e, "not a literal the reader knows: %s", r.source(e))
}

func (r *reader) call(e *ast.CallExpr) (any, error) {
	name := r.source(e.Fun)
	args := make([]any, len(e.Args))
	for i, a := range e.Args {
		v, err := r.eval(a)
		if err != nil {
			return nil, err
		}
		args[i] = v
	}
	switch {
	case (name == "ptr.To" || name == "new") && len(args) == 1:
		return pointer{args[0]}, nil
	case (name == "int64" || name == "uint64") && len(args) == 1:
		if v, ok := args[0].(int64); ok {
			return v, nil
		}
	case name == "max" || name == "min":
		best := int64(0)
		for i, a := range args {
			v, ok := a.(int64)
			if !ok {
				return nil, r.errorf(e, "%s of %T", name, a)
			}
			if i == 0 || (name == "max" && v > best) || (name == "min" && v < best) {
				best = v
			}
		}
		if len(args) > 0 {
			return best, nil
		}
	case name == "resource.MustParse" && len(args) == 1:
		if s, ok := args[0].(string); ok {
			return resource.ParseQuantity(s)
		}
	}
	return nil, r.errorf(e, "not a call the reader knows: %s", r.source(e))
}

func (r *reader) composite(e *ast.CompositeLit) (any, error) {
	switch e.Type.(type) {
	case *ast.MapType:
		m := map[string]any{}
		for _, elt := range e.Elts {
			kv := elt.(*ast.KeyValueExpr)
			k, err := r.eval(kv.Key)
			if err != nil {
				return nil, err
			}
			ks, ok := k.(string)
			if !ok {
				return nil, r.errorf(kv, "a map key of type %T", k)
			}
			v, err := r.eval(kv.Value)
			if err != nil {
				return nil, err
			}
			m[ks] = v
		}
		return m, nil
	case *ast.ArrayType:
		var list []any
		for _, elt := range e.Elts {
			v, err := r.eval(elt)
			if err != nil {
				return nil, err
			}
			list = append(list, v)
		}
		return list, nil
	default:
		// A struct, its type written or elided.
		f := fields{}
		for _, elt := range e.Elts {
			kv, ok := elt.(*ast.KeyValueExpr)
			if !ok {
				return nil, r.errorf(elt, "a struct literal without field names")
			}
			v, err := r.eval(kv.Value)
			if err != nil {
				return nil, err
			}
			f[r.source(kv.Key)] = v
		}
		return f, nil
	}
}

func (r *reader) source(e ast.Node) string {
	start, end := r.fset.Position(e.Pos()), r.fset.Position(e.End())
	data, err := os.ReadFile(start.Filename)
	if err != nil || end.Offset > len(data) {
		return fmt.Sprintf("%T", e)
	}
	text := string(data[start.Offset:end.Offset])
	if len(text) > 80 {
		text = text[:80] + "..."
	}
	return text
}

// scenario reads one entry of the table.
func (r *reader) scenario(e ast.Expr) (*celScenario, error) {
	lit, ok := e.(*ast.CompositeLit)
	if !ok {
		return nil, r.errorf(e, "not a struct literal")
	}
	s := &celScenario{}
	for _, elt := range lit.Elts {
		kv, ok := elt.(*ast.KeyValueExpr)
		if !ok {
			return nil, r.errorf(elt, "a field without a name")
		}
		field := r.source(kv.Key)
		v, err := r.eval(kv.Value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		if err := s.set(field, v); err != nil {
			return nil, r.errorf(kv, "%s: %v", field, err)
		}
	}
	return s, nil
}

func (s *celScenario) set(field string, v any) error {
	var err error
	switch field {
	case "envType":
		var t any
		if t, err = deref(v); err == nil {
			env, ok := t.(environment.Type)
			if !ok {
				return fmt.Errorf("%T is not an environment type", t)
			}
			s.envType = &env
		}
	case "enableConsumableCapacity":
		s.enableConsumableCapacity, err = as[bool](v)
	case "enableListTypeAttributes":
		s.enableListTypeAttributes, err = pointerTo[bool](v)
	case "expression":
		s.expression, err = as[string](v)
	case "driver":
		s.driver, err = as[string](v)
	case "allowMultipleAllocations":
		s.allowMultipleAllocations, err = pointerTo[bool](v)
	case "attributes":
		s.attributes, err = attributes(v)
	case "capacity":
		s.capacity, err = capacity(v)
	case "expectCompileError":
		s.expectCompileError, err = as[string](v)
	case "expectMatchError":
		s.expectMatchError, err = as[string](v)
	case "expectMatch":
		s.expectMatch, err = as[bool](v)
	case "expectCost":
		var cost int64
		cost, err = as[int64](v)
		s.expectCost = uint64(cost)
	default:
		return fmt.Errorf("a field the reader does not know")
	}
	return err
}

func as[T any](v any) (T, error) {
	t, ok := v.(T)
	if !ok {
		var zero T
		return zero, fmt.Errorf("%T where %T was expected", v, zero)
	}
	return t, nil
}

func deref(v any) (any, error) {
	p, ok := v.(pointer)
	if !ok {
		return nil, fmt.Errorf("%T where a pointer was expected", v)
	}
	return p.value, nil
}

func pointerTo[T any](v any) (*T, error) {
	if v == nil {
		return nil, nil
	}
	inner, err := deref(v)
	if err != nil {
		return nil, err
	}
	t, err := as[T](inner)
	return &t, err
}

func listOf[T any](v any) ([]T, error) {
	list, err := as[[]any](v)
	if err != nil {
		return nil, err
	}
	out := make([]T, 0, len(list))
	for _, item := range list {
		t, err := as[T](item)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, nil
}

func attributes(v any) (map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, error) {
	m, err := as[map[string]any](v)
	if err != nil {
		return nil, err
	}
	out := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for name, value := range m {
		f, err := as[fields](value)
		if err != nil {
			return nil, err
		}
		var a resourceapi.DeviceAttribute
		for field, x := range f {
			switch field {
			case "IntValue":
				a.IntValue, err = pointerTo[int64](x)
			case "BoolValue":
				a.BoolValue, err = pointerTo[bool](x)
			case "StringValue":
				a.StringValue, err = pointerTo[string](x)
			case "VersionValue":
				a.VersionValue, err = pointerTo[string](x)
			case "IntValues":
				a.IntValues, err = listOf[int64](x)
			case "BoolValues":
				a.BoolValues, err = listOf[bool](x)
			case "StringValues":
				a.StringValues, err = listOf[string](x)
			case "VersionValues":
				a.VersionValues, err = listOf[string](x)
			default:
				err = fmt.Errorf("attribute field %s unknown to the reader", field)
			}
			if err != nil {
				return nil, fmt.Errorf("attribute %s: %w", name, err)
			}
		}
		out[resourceapi.QualifiedName(name)] = a
	}
	return out, nil
}

func capacity(v any) (map[resourceapi.QualifiedName]resourceapi.DeviceCapacity, error) {
	m, err := as[map[string]any](v)
	if err != nil {
		return nil, err
	}
	out := map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{}
	for name, value := range m {
		f, err := as[fields](value)
		if err != nil {
			return nil, err
		}
		var c resourceapi.DeviceCapacity
		for field, x := range f {
			if field != "Value" {
				return nil, fmt.Errorf("capacity %s: field %s unknown to the reader", name, field)
			}
			if c.Value, err = as[resource.Quantity](x); err != nil {
				return nil, fmt.Errorf("capacity %s: %w", name, err)
			}
		}
		out[resourceapi.QualifiedName(name)] = c
	}
	return out, nil
}
