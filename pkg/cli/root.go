// Package cli holds the kubectl nvdriver commands, one file per command in
// kubectl's Options / Complete / Validate / Run shape.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	_ "k8s.io/client-go/plugin/pkg/client/auth" // cloud auth plugins, as kubectl has
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/nvdriver/nvdriver/pkg/version"
)

// Exit codes (docs/design.md, "Exit codes").
const (
	ExitOK       = 0
	ExitError    = 1
	ExitFindings = 3
)

// FindingsError makes a command exit 3 after printing its findings.
type FindingsError struct{ Msg string }

func (e *FindingsError) Error() string { return e.Msg }

// usageError is an error in how the command was called: it is printed with
// a pointer to the command's help, as kubectl does.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error {
	return &usageError{msg: fmt.Sprintf(format, a...)}
}

// asUsage marks a validation error as a usage error.
func asUsage(err error) error {
	var u *usageError
	if errors.As(err, &u) {
		return err
	}
	return &usageError{msg: err.Error()}
}

// exactArgs is cobra.ExactArgs with a message that names the argument.
func exactArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s takes exactly %d argument (%s), got %d", cmd.Name(), n, what, len(args))
		}
		return nil
	}
}

// maxArgs is cobra.MaximumNArgs as a usage error.
func maxArgs(n int, what string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) > n {
			return usageErrorf("%s takes at most %d argument (%s), got %d", cmd.Name(), n, what, len(args))
		}
		return nil
	}
}

// NewRootCommand builds `kubectl nvdriver`.
func NewRootCommand(in io.Reader, out, errOut io.Writer) *cobra.Command {
	s := genericiooptions.IOStreams{In: in, Out: out, ErrOut: errOut}
	flags := genericclioptions.NewConfigFlags(true)
	noColor := false
	root := &cobra.Command{
		Use:   "nvdriver",
		Short: "Manage NVIDIA GPU drivers through NVIDIADriver resources",
		Long: `kubectl nvdriver manages NVIDIA GPU drivers on Kubernetes through NVIDIADriver
resources (nvidia.com/v1alpha1), with the nvdriver controller or NVIDIA's GPU Operator.

Exit status: 0 ok, 1 error, 3 findings (conflicts, doctor errors, failed upgrades).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Annotations:   map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl nvdriver"},
	}
	root.SetIn(in)
	root.SetOut(out)
	root.SetErr(errOut)
	flags.AddFlags(root.PersistentFlags())
	root.PersistentFlags().BoolVar(&noColor, "no-color", false, "never colour the output (also off when NO_COLOR is set or the output is not a terminal)")
	root.AddCommand(
		NewCmdAssign(flags, s),
		NewCmdPreview(flags, s, &noColor),
		NewCmdUpgrade(flags, s, &noColor),
		NewCmdStatus(flags, s, &noColor),
		NewCmdDoctor(flags, s, &noColor),
		NewCmdRollout(flags, s),
		newVersionCommand(out),
		newCompletionCommand(root, out),
	)
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{msg: err.Error()} })
	return root
}

// Main runs the plugin and returns its exit code.
func Main(args []string, in io.Reader, out, errOut io.Writer) int {
	// controller-runtime's client and cache log through a logger the plugin
	// never shows (it says what matters itself); without one, status -w
	// printed a "log.SetLogger(...) was never called" stack trace after 30 s.
	ctrllog.SetLogger(logr.Discard())
	// Ctrl-C cancels the command's context: a write in flight fails, and a
	// command that changed something puts it back (assign restores labels).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return MainContext(ctx, args, in, out, errOut)
}

// MainContext is Main with a context (tests cancel it).
func MainContext(ctx context.Context, args []string, in io.Reader, out, errOut io.Writer) int {
	root := NewRootCommand(in, out, errOut)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil {
		var f *FindingsError
		if errors.As(err, &f) {
			return ExitFindings
		}
		fmt.Fprintf(errOut, "error: %v\n", err)
		var u *usageError
		if errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command") {
			fmt.Fprintf(errOut, "See '%s --help' for usage.\n", commandPath(cmd))
		}
		return ExitError
	}
	return ExitOK
}

// commandPath is how the user typed the command: kubectl nvdriver upgrade.
func commandPath(cmd *cobra.Command) string {
	if cmd == nil || !cmd.HasParent() {
		return "kubectl nvdriver"
	}
	return commandPath(cmd.Parent()) + " " + cmd.Name()
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
				return fmt.Errorf("invalid --output %q: use json or omit it", output)
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json")
	return cmd
}

func newCompletionCommand(root *cobra.Command, out io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "completion SHELL",
		Short: "Print a shell completion script (bash, zsh, fish or powershell)",
		Long: `Print a completion script for kubectl nvdriver.

kubectl completes plugin commands through an executable named kubectl_complete-nvdriver
on your PATH; the release archive ships one. With it installed, kubectl nvdriver <TAB>
completes commands, NVIDIADriver names and node names.`,
		Example: `  source <(kubectl nvdriver completion bash)
  kubectl nvdriver completion zsh > "${fpath[1]}/_kubectl-nvdriver"`,
		Args:      cobra.ExactArgs(1),
		ValidArgs: []string{"bash", "zsh", "fish", "powershell"},
		RunE: func(_ *cobra.Command, args []string) error {
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, true)
			case "zsh":
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, true)
			case "powershell":
				return root.GenPowerShellCompletionWithDesc(out)
			}
			return fmt.Errorf("unsupported shell %q: use bash, zsh, fish or powershell", args[0])
		},
	}
}

func fixedCompletion(values ...string) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
		return values, cobra.ShellCompDirectiveNoFileComp
	}
}

// completeDrivers completes NVIDIADriver names from the cluster.
func completeDrivers(flags *genericclioptions.ConfigFlags) func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
	return func(cmd *cobra.Command, _ []string, prefix string) ([]string, cobra.ShellCompDirective) {
		c, _, err := clientFor(flags)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		in, err := readDriverNames(cmd.Context(), c)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range in {
			if strings.HasPrefix(n, prefix) {
				out = append(out, n)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
