// Command gencheader writes libuvm/src/wire_gen.h, the C library's copy
// of the wire constants, from their Go definitions (wire.CHeader):
//
//	go run ./internal/wire/internal/gencheader -o libuvm/src/wire_gen.h
//
// With -check it writes nothing and fails if the file differs, for `make
// lint`.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/softuvm/softuvm/internal/wire"
)

func main() {
	out := flag.String("o", "", "the header to write (or to check)")
	check := flag.Bool("check", false, "fail if the header differs from what the Go definitions give, instead of writing it")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: gencheader [-check] -o libuvm/src/wire_gen.h")
		os.Exit(2)
	}
	want := wire.CHeader()
	if *check {
		got, err := os.ReadFile(*out)
		if err != nil || !bytes.Equal(got, want) {
			why := "it differs from the Go definitions"
			if err != nil {
				why = err.Error()
			}
			fmt.Fprintf(os.Stderr, "%s is stale (%s): run go generate ./internal/wire\n", *out, why)
			os.Exit(1)
		}
		return
	}
	if err := os.WriteFile(*out, want, 0o644); err != nil {
		fmt.Fprintln(os.Stderr, "gencheader:", err)
		os.Exit(1)
	}
}
