// Command kubectl-nvdriver is the kubectl plugin (kubectl nvdriver ...).
package main

import (
	"os"

	"github.com/nvdriver/nvdriver/pkg/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
