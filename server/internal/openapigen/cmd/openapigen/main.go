package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/actionledger/ledger/server/internal/openapigen"
)

func main() {
	root := flag.String("root", "..", "the module's root directory, relative to the working directory")
	document := flag.String("document", "openapi.json", "the OpenAPI document to rewrite")
	flag.Parse()
	if err := run(*root, *document); err != nil {
		fmt.Fprintln(os.Stderr, "openapigen:", err)
		os.Exit(1)
	}
}

func run(root, document string) error {
	in, err := os.ReadFile(document)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	out, err := openapigen.Generate(in, root)
	if err != nil {
		return err
	}
	if err := os.WriteFile(document, out, 0o644); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}
