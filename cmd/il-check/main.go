// Command peregrine-il-check runs in a pod's init container, in the image of the containers it
// precedes, and copies the interception library where LD_PRELOAD looks for it only when that
// image's loader binds it (package csi/ilcheck). It prints one line and always exits 0: without
// the library the pod runs as it would without interception.
//
// It is built static (CGO_ENABLED=0) because it runs in images whose C library is unknown.
package main

import (
	"flag"
	"fmt"

	"github.com/peregrine-storage/peregrine/csi/ilcheck"
)

type programs []string

func (p *programs) String() string     { return fmt.Sprint(*p) }
func (p *programs) Set(v string) error { *p = append(*p, v); return nil }

func main() {
	from := flag.String("from", "/opt/peregrine/il-host", "directory with the library, ISA-L and this checker (the node's)")
	to := flag.String("to", "/opt/peregrine/il", "directory that receives the library when the image binds it")
	var first programs
	flag.Var(&first, "program", "a program of the image to probe with before the well-known ones (repeatable)")
	flag.Parse()
	fmt.Println(ilcheck.Check(*from, *to, first...))
}
