// Command controller reconciles NVIDIADriver resources into driver DaemonSets.
package main

import (
	"fmt"
	"os"
)

func main() {
	// The reconciler lands with the controller issue; until then this binary
	// says so plainly instead of pretending to run.
	fmt.Fprintln(os.Stderr, "error: the nvdriver controller is not implemented in this build yet")
	os.Exit(1)
}
