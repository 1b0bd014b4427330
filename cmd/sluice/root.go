package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
	"github.com/spf13/pflag"

	"github.com/sluice-dtr/sluice/internal/app"
	"github.com/sluice-dtr/sluice/pkg/version"
)

// The command line is built with cobra: the commands, their flags and help
// are one set of definitions, from which the shell completion (sluice
// completion) and the man pages (sluice man) are generated too. kong and
// fisk would have served; cobra is the one most operators have met (kubectl,
// docker, gh) and its completion covers bash, zsh, fish and PowerShell.

const rootLong = `sluice moves files for jobs, sharing transfer slots fairly between groups of users.

Every serving process (all, a role, demo) serves HTTP at SLUICE_HTTP_ADDR: /healthz,
/metrics (Prometheus) and, where the scheduler runs, a live web page at /.
With SLUICE_HTTP_TLS_CERT and SLUICE_HTTP_TLS_KEY it serves HTTPS instead.

NATS logins: a user and password, a credentials file (SLUICE_NATS_CREDS) or an nkey
(SLUICE_NATS_NKEY); TLS with a tls:// URL or SLUICE_NATS_TLS_*. NATS_URL may list several
servers of a cluster, comma-separated. The client commands also connect with a nats context:
the one named by --context or NATS_CONTEXT, else the one selected with "nats context select";
flags and SLUICE_* settings win over it.

Who is asking: the client commands speak on the operator's subjects unless SLUICE_AS_USER names
a user, whose own subjects (dtr.submit.<user>, sluice.api.*.<user>) the NATS server lets only
that user publish to; a bearer token in BEARER_TOKEN or BEARER_TOKEN_FILE is sent with every
request. A user sees and changes only their own jobs and DTRs (docs/security.md).

Traces (one per DTR) are exported when OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) or
OTEL_TRACES_EXPORTER is set, over OTLP/HTTP or, with OTEL_EXPORTER_OTLP_PROTOCOL=grpc, OTLP/gRPC
(the standard OTEL_* variables: docs/operations.md, "Traces"), from the service sluice-<role>
("sluice" for all and demo) unless OTEL_SERVICE_NAME names it. status and why print a DTR's
trace id.

Exit status: 0 done; 1 failed (the service refused or could not be reached, a file could
not be read...); 2 the command line is wrong; 3 the job ended failed: a file that had to be done was not
(submit --wait, cp); 4 no such job or DTR, or nothing to cancel.

"sluice help" lists the environment variables by role; "sluice help GROUP" only one group's.`

// Exit statuses; rootLong and docs/usage.md say what each means.
const (
	exitFailed   = 1
	exitUsage    = 2
	exitJobEnded = 3
	exitNotFound = 4
)

// exitError is an error that ends the process with a given status.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageErrorf is a mistake in the command line: exit status 2.
func usageErrorf(format string, a ...any) error {
	return &exitError{exitUsage, fmt.Errorf(format, a...)}
}

// exitCode is the process's exit status for what run returned.
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	var ae *apiError
	if errors.As(err, &ae) {
		switch ae.code {
		case "404":
			return exitNotFound
		case "400": // the service found the request malformed
			return exitUsage
		}
	}
	if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "unknown flag") {
		return exitUsage
	}
	return exitFailed
}

// newRoot builds the command tree, printing to stdout. envErr, if not nil,
// is why the environment could not be read: every command that needs
// settings fails with it.
func newRoot(cfg *Config, envErr error, stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Sluice moves files for jobs, sharing transfer slots fairly between groups of users",
		Long:          rootLong,
		Version:       version.String(),
		SilenceErrors: true,
		SilenceUsage:  true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if envErr != nil && cmd.Annotations[noSettings] == "" {
				return envErr
			}
			return nil
		},
	}
	root.SetOut(stdout)
	root.SetVersionTemplate("sluice {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usageErrorf("%s: %w (see %s --help)", c.CommandPath(), err, c.CommandPath())
	})
	root.AddGroup(
		&cobra.Group{ID: "serve", Title: "Run Sluice:"},
		&cobra.Group{ID: "client", Title: "Jobs and DTRs (talk to a running Sluice):"},
		&cobra.Group{ID: "tools", Title: "Tools:"},
	)
	for _, c := range serveCommands(cfg) {
		c.GroupID = "serve"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{
		submitCommand(cfg), cpCommand(cfg), jobsCommand(cfg), statusCommand(cfg), sharesCommand(cfg), whyCommand(cfg), historyCommand(cfg),
		priorityCommand(cfg), cancelCommand(cfg), reconfigureCommand(cfg), workersCommand(cfg), linksCommand(cfg),
	} {
		c.GroupID = "client"
		root.AddCommand(c)
	}
	for _, c := range []*cobra.Command{
		simulateCommand(cfg), benchCommand(cfg), healthcheckCommand(cfg), manCommand(root),
	} {
		c.GroupID = "tools"
		root.AddCommand(c)
	}
	root.SetHelpCommand(helpCommand(root))
	root.SetHelpCommandGroupID("tools")
	root.SetCompletionCommandGroupID("tools")
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			markNoSettings(c)
		}
	}
	return root
}

// noSettings annotates a command that runs without the environment's
// settings, and its subcommands.
const noSettings = "sluice/no-settings"

func markNoSettings(c *cobra.Command) {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[noSettings] = "yes"
	for _, sub := range c.Commands() {
		markNoSettings(sub)
	}
}

// helpCommand is "sluice help [COMMAND|GROUP]": the commands and every
// environment variable by role; a command's help (and, for a role, its
// variables); or one group of variables.
func helpCommand(root *cobra.Command) *cobra.Command {
	var groups []string
	for _, g := range app.Groups {
		groups = append(groups, g.Role)
	}
	c := &cobra.Command{
		Use:   "help [COMMAND | GROUP]",
		Short: "Show the commands and the environment variables by role, or one command's or group's",
		Long: "Show the commands and the environment variables by role; with a command, its help (and for a role its\n" +
			"variables); with a group, only that group's variables. The groups: " + strings.Join(groups, ", ") + ".",
		Args: maxArgs(1, "help takes at most one command or group"),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			names := slices.Clone(groups)
			for _, c := range root.Commands() {
				if c.IsAvailableCommand() {
					names = append(names, c.Name())
				}
			}
			slices.Sort(names)
			return slices.Compact(names), cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			out := cmd.OutOrStdout()
			if len(args) == 0 {
				root.SetOut(out)
				if err := root.Help(); err != nil {
					return err
				}
				fmt.Fprint(out, "\nEnvironment, by role (flags win over it):\n\n")
				return app.PrintSettings(out, "")
			}
			name := args[0]
			isGroup := slices.Contains(groups, name)
			if c, _, err := root.Find(args); err == nil && c != root {
				c.SetOut(out)
				if err := c.Help(); err != nil {
					return err
				}
				if !isGroup {
					return nil
				}
				fmt.Fprintln(out)
			} else if !isGroup {
				return usageErrorf("no command or settings group %q: the groups are %s", name, strings.Join(groups, ", "))
			}
			return app.PrintSettings(out, name)
		},
	}
	markNoSettings(c)
	return c
}

// manCommand writes a man page for every command.
func manCommand(root *cobra.Command) *cobra.Command {
	c := &cobra.Command{
		Use:   "man DIR",
		Short: "Write the man pages (section 1) of sluice and each of its commands to DIR",
		Args:  exactArgs(1, "man needs the directory to write the pages to"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := os.MkdirAll(args[0], 0o755); err != nil {
				return err
			}
			root.DisableAutoGenTag = true
			err := doc.GenManTree(root, &doc.GenManHeader{Title: "SLUICE", Section: "1", Source: "sluice " + version.String()}, args[0])
			if err != nil {
				return fmt.Errorf("man pages: %w", err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "man pages written to %s (try: man -l %s/sluice.1)\n", args[0], args[0])
			return nil
		},
	}
	markNoSettings(c)
	return c
}

// exactArgs and maxArgs check a command's positional arguments: a wrong
// count is a usage error that says what the command needs.
func exactArgs(n int, need string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return usageErrorf("%s", need)
		}
		return nil
	}
}

func maxArgs(n int, need string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) > n {
			return usageErrorf("%s", need)
		}
		return nil
	}
}

// jsonFlag adds --json to a command that prints data.
func jsonFlag(c *cobra.Command) *bool {
	return c.Flags().Bool("json", false, "print the answer as JSON (indented), for scripts")
}

// printJSON prints v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// longFlags lets the single-dash long flags that Go's flag package took
// (-wait, -nats URL) go on working: an argument "-name" or "-name=value"
// where name is a long flag of the command is read as "--name". Arguments
// after "--" are left alone.
// An argument that is a flag's value (--name -stage) is left as it is.
func longFlags(root *cobra.Command, args []string) []string {
	c, _, err := root.Find(args)
	if err != nil {
		return args
	}
	c.InitDefaultHelpFlag()
	root.InitDefaultVersionFlag()
	out := slices.Clone(args)
	value := false // the argument is the value of the flag before it
	for i, a := range out {
		if a == "--" {
			break
		}
		if value {
			value = false
			continue
		}
		if len(a) < 2 || a[0] != '-' {
			continue
		}
		name, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f := lookupFlag(c, name)
		if f == nil && len(name) == 1 {
			f = c.Flags().ShorthandLookup(name)
		}
		if f != nil && f.NoOptDefVal == "" && !hasValue {
			value = true // its value comes next
		}
		if f != nil && a[1] != '-' && len(name) > 1 {
			out[i] = "-" + a
		}
	}
	return out
}

func lookupFlag(c *cobra.Command, name string) *pflag.Flag {
	if f := c.Flags().Lookup(name); f != nil {
		return f
	}
	return c.InheritedFlags().Lookup(name)
}
