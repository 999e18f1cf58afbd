// Command registry is the demo's container registry: a real OCI registry
// (go-containerregistry's) on loopback, and a client that pushes small
// random images under the tags a demo needs.
//
//	registry serve --addr 127.0.0.1:5000   # until killed
//	registry push 127.0.0.1:5000/nvidia/driver:550.90.07-ubuntu22.04 ...
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nvdriver/nvdriver/pkg/imagecheck/registrytest"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: registry serve [--addr 127.0.0.1:5000] | registry push HOST:PORT/REPO:TAG...")
	}
	switch args[0] {
	case "serve":
		fs := flag.NewFlagSet("serve", flag.ContinueOnError)
		addr := fs.String("addr", "127.0.0.1:5000", "loopback address to listen on")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		if !strings.HasPrefix(*addr, "127.") && !strings.HasPrefix(*addr, "localhost:") {
			return fmt.Errorf("--addr %s: the demo registry listens on loopback only", *addr)
		}
		r, err := registrytest.Start(*addr, "", "")
		if err != nil {
			return err
		}
		fmt.Println(r.Host)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
		<-sig
		r.Close()
		return nil
	case "push":
		for _, ref := range args[1:] {
			host, _, ok := strings.Cut(ref, "/")
			if !ok {
				return fmt.Errorf("%s: want HOST:PORT/REPO:TAG", ref)
			}
			if err := (&registrytest.Registry{Host: host}).Push(ref); err != nil {
				return err
			}
			fmt.Println("pushed", ref)
		}
		return nil
	}
	return fmt.Errorf("unknown command %q: serve or push", args[0])
}
