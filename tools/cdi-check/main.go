// cdi-check validates CDI spec files the way container runtimes load them:
// against the CDI specification's JSON schema (schema/schema.json and
// schema/defs.json, from github.com/cncf-tags/container-device-interface,
// Apache-2.0) and with tags.cncf.io/container-device-interface's own loader
// (the one containerd and CRI-O use: version, vendor and class, device
// names, container edits). Prints "ok FILE" or "invalid FILE: reason" per
// file; exits 1 if any is invalid.
package main

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"os"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

//go:embed schema/schema.json schema/defs.json
var schemas embed.FS

func load(name string) any {
	data, err := schemas.ReadFile("schema/" + name)
	if err != nil {
		panic(err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		panic(err)
	}
	return doc
}

func main() {
	compiler := jsonschema.NewCompiler()
	for _, name := range []string{"schema.json", "defs.json"} {
		if err := compiler.AddResource(name, load(name)); err != nil {
			panic(err)
		}
	}
	schema, err := compiler.Compile("schema.json")
	if err != nil {
		panic(err)
	}
	failed := false
	for _, path := range os.Args[1:] {
		data, err := os.ReadFile(path)
		if err == nil {
			var doc any
			doc, err = jsonschema.UnmarshalJSON(bytes.NewReader(data))
			if err == nil {
				err = schema.Validate(doc)
			}
		}
		if err == nil {
			// The loader runtimes use: it validates what the schema cannot.
			_, err = cdi.ReadSpec(path, 0)
		}
		if err != nil {
			failed = true
			msg, _ := json.Marshal(err.Error())
			fmt.Printf("invalid %s: %s\n", path, msg)
			continue
		}
		fmt.Printf("ok %s\n", path)
	}
	if failed {
		os.Exit(1)
	}
}
