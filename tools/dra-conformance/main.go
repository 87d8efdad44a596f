// dra-conformance extracts the test tables Kubernetes checks its own DRA code
// with (k8s.io/dynamic-resource-allocation v0.36.3) into JSON lines, each
// case with its inputs and what Kubernetes answers for it, for
// libs/dra/tests/conformance.rs to run through Switchyard:
//
//	dra-conformance allocator   the allocator table: structured/internal/allocatortesting
//	                            (TestAllocator and TestLexicographicalAllocator)
//	dra-conformance cel [FILE]  the CEL table: the testcases of cel/compile_test.go
//	                            (FILE defaults to that file in the Go module cache)
//
// Nothing of Kubernetes is copied: the allocator table is run by its own
// harness, with a recording allocator in place of the one under test (see
// allocator.go), and the CEL table, a variable of a _test.go file that no
// program can import, is read with go/parser (see cel.go). Each case's
// answer is Kubernetes' own, computed here; the table's expectations are
// checked against it too, so that a case read wrongly cannot pass unnoticed.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
)

func fail(err error) {
	fmt.Fprintln(os.Stderr, "dra-conformance:", err)
	os.Exit(2)
}

// writeLines prints one JSON line per record.
func writeLines[T any](w *os.File, records []T) error {
	out := bufio.NewWriter(w)
	enc := json.NewEncoder(out)
	for _, r := range records {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return out.Flush()
}

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: dra-conformance allocator | cel [FILE]"))
	}
	mode, args := os.Args[1], os.Args[2:]
	switch mode {
	case "allocator":
		runAllocatorTable()
	case "cel":
		file := ""
		if len(args) > 0 {
			file = args[0]
		}
		records, err := celTable(file)
		if err != nil {
			fail(err)
		}
		if err := writeLines(os.Stdout, records); err != nil {
			fail(err)
		}
	default:
		fail(fmt.Errorf("unknown mode %q", mode))
	}
}
