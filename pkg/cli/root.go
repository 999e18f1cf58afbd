// Package cli holds the kubectl nvdriver commands, one file per command in
// kubectl's Options / Complete / Validate / Run shape.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/nvdriver/nvdriver/pkg/version"
)

// Exit codes (SPEC §6).
const (
	ExitOK       = 0
	ExitError    = 1
	ExitFindings = 3
)

// FindingsError makes a command exit 3 after printing its findings.
type FindingsError struct{ Msg string }

func (e *FindingsError) Error() string { return e.Msg }

// NewRootCommand builds `kubectl nvdriver`.
func NewRootCommand(in io.Reader, out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "nvdriver",
		Short:         "Manage NVIDIA GPU drivers through NVIDIADriver resources",
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl nvdriver"},
	}
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	root.AddCommand(newVersionCommand(out))
	return root
}

// Main runs the plugin and returns its exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	root := NewRootCommand(in, out, errOut)
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		var f *FindingsError
		if errors.As(err, &f) {
			return ExitFindings
		}
		fmt.Fprintf(errOut, "error: %v\n", err)
		return ExitError
	}
	return ExitOK
}

func newVersionCommand(out io.Writer) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the plugin version",
		Example: `  kubectl nvdriver version
  kubectl nvdriver version -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "":
				_, err := fmt.Fprintf(out, "kubectl-nvdriver %s\n", version.Version)
				return err
			case "json":
				return json.NewEncoder(out).Encode(map[string]string{"version": version.Version})
			default:
				return fmt.Errorf("unknown output format %q: use -o json or omit -o", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json")
	return cmd
}
