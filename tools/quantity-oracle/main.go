// quantity-oracle answers, for each line of stdin, what Kubernetes'
// k8s.io/apimachinery/pkg/api/resource makes of it: the reference the Rust
// implementation in libs/dra is tested against.
//
// Input lines:
//
//	parse <s>           -> ok <String()> <canonical> <format>  |  err <message>
//	cmp <a> <b>         -> ok <-1|0|1>                         |  err <message>
//	add <a> <b>         -> ok <String() of a+b> <format>       |  err <message>
//	sub <a> <b>         -> ok <String() of a-b> <format>       |  err <message>
//	bench parse <s> <n> -> ok <nanoseconds per ParseQuantity>
//	bench cmp <a> <b> <n> -> ok <nanoseconds per Cmp>
package main

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<20)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	for in.Scan() {
		f := strings.Split(in.Text(), " ")
		switch f[0] {
		case "parse":
			q, err := resource.ParseQuantity(f[1])
			if err != nil {
				fmt.Fprintf(out, "err %v\n", err)
				continue
			}
			number, suffix := q.CanonicalizeBytes(nil)
			fmt.Fprintf(out, "ok %s %s%s %s\n", q.String(), number, suffix, q.Format)
		case "cmp", "add", "sub":
			a, err := resource.ParseQuantity(f[1])
			if err != nil {
				fmt.Fprintf(out, "err %v\n", err)
				continue
			}
			b, err := resource.ParseQuantity(f[2])
			if err != nil {
				fmt.Fprintf(out, "err %v\n", err)
				continue
			}
			switch f[0] {
			case "cmp":
				fmt.Fprintf(out, "ok %d\n", a.Cmp(b))
			case "add":
				a.Add(b)
				fmt.Fprintf(out, "ok %s %s\n", a.String(), a.Format)
			case "sub":
				a.Sub(b)
				fmt.Fprintf(out, "ok %s %s\n", a.String(), a.Format)
			}
		case "bench":
			bench(out, f[1:])
		default:
			fmt.Fprintf(out, "err unknown request %q\n", f[0])
		}
	}
}

var sink int

func bench(out *bufio.Writer, f []string) {
	n, err := strconv.Atoi(f[len(f)-1])
	if err != nil || n <= 0 {
		fmt.Fprintf(out, "err bad count %q\n", f[len(f)-1])
		return
	}
	switch f[0] {
	case "parse":
		start := time.Now()
		for i := 0; i < n; i++ {
			q, _ := resource.ParseQuantity(f[1])
			sink += int(q.Format[0])
		}
		fmt.Fprintf(out, "ok %.1f\n", float64(time.Since(start).Nanoseconds())/float64(n))
	case "cmp":
		a := resource.MustParse(f[1])
		b := resource.MustParse(f[2])
		start := time.Now()
		for i := 0; i < n; i++ {
			sink += a.Cmp(b)
		}
		fmt.Fprintf(out, "ok %.1f\n", float64(time.Since(start).Nanoseconds())/float64(n))
	default:
		fmt.Fprintf(out, "err unknown benchmark %q\n", f[0])
	}
}
