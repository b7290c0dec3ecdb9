package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"

	"github.com/areev/runlease"
)

// Exit statuses. peek reports what it found through exitHeld, exitFree and
// exitAbsent, so scripts can branch without parsing output.
const (
	exitOK     = 0 // success; peek: the run is held by a live lease
	exitError  = 1 // the command failed; the error is on stderr
	exitUsage  = 2 // the command line is wrong: every RUN-E001
	exitFree   = 3 // peek: the lease expired or was released
	exitAbsent = 4 // peek: the run has no lease row
	// exitCorrupt: status showed a corrupt row, which blocks its run or
	// slot until it is repaired; the report was printed in full.
	exitCorrupt = 5
	exitHeld    = exitOK
)

// Main runs the command line args (without the program's name) on the
// process's standard streams and returns its exit status, for os.Exit.
// Interrupting the process (SIGINT, SIGTERM) ends a --watch loop, or any
// command waiting on its store, cleanly. kinds add stores beyond the
// embedded and Postgres ones, each with its own flag.
func Main(args []string, kinds ...StoreKind) int {
	return run(args, os.Stdin, os.Stdout, os.Stderr, kinds...)
}

// run is Main on the streams given.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer, kinds ...StoreKind) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return Run(ctx, args, stdin, stdout, stderr, kinds...)
}

// Run is Main with the context and streams given: the command gives up
// when ctx ends, as it does on an interrupt under Main.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer, kinds ...StoreKind) int {
	c := newCLI(ctx, stdin, stdout, stderr)
	if err := c.addKinds(kinds); err != nil {
		return c.exit(err)
	}
	return c.main(args)
}

// command is one subcommand: its name, a one-line summary for the command
// list, and the function that runs it with the arguments after its name.
type command struct {
	name    string
	summary string
	run     func(c *cli, args []string) error
}

// commands lists the subcommands in the order "runlease help" shows them.
// It is set in init, since completion, one of them, reads it.
var commands []command

func init() {
	commands = []command{
		{"demo", "play a short scenario on a fresh embedded store and print its timeline", (*cli).demo},
		{"status", "list every lease, and slot occupancy per scope", (*cli).status},
		{"peek", "show one run's lease; the exit status says held, free or absent", (*cli).peek},
		{"explain", "tell why a run waits for slots: limits, queues, who is ahead and who holds them", (*cli).explain},
		{"release", "force-release a stuck lease, keeping its fence", (*cli).release},
		{"repair", "replace a corrupt row: a lease by a tombstone at a fence you give, a slot by nothing", (*cli).repair},
		{"prune", "remove released and expired rows older than a horizon", (*cli).prune},
		{"serve", "serve the status page over HTTP: leases, slots and corrupt rows, refreshed live", (*cli).serve},
		{"schema", "print the Postgres table's DDL for migration tools", (*cli).schema},
		{"completion", "print a bash or zsh script that completes commands and flags", (*cli).completion},
		{"version", "print the module version this binary was built from", (*cli).version},
	}
}

// main dispatches args to a command and turns its error into an exit
// status.
func (c *cli) main(args []string) int {
	c.collectSecrets(args)
	if len(args) == 0 {
		c.topUsage(c.stderr)
		return exitUsage
	}
	name, rest := args[0], args[1:]
	switch name {
	case "--version", "-version":
		name = "version"
	case "help", "-h", "-help", "--help":
		if len(rest) == 0 {
			c.topUsage(c.stdout)
			return exitOK
		}
		name, rest = rest[0], []string{"--help"}
	}
	for _, cmd := range commands {
		if cmd.name == name {
			return c.exit(cmd.run(c, rest))
		}
	}
	return c.exit(usagef("", "unknown command %q", name))
}

const versionHelp = `
Version prints the version of the module the binary was built from, as
"go install github.com/areev/runlease/cmd/runlease@v0.1.0" records it
(v0.1.0), or "(devel)" for a build from a work tree, and the Go version
that built it. "runlease --version" is the same.
`

func (c *cli) version(args []string) error {
	fs := c.newFlags("version", "", versionHelp)
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) > 0:
		return usagef("version", "unexpected argument %q", pos[0])
	}
	_, err = fmt.Fprintf(c.stdout, "runlease %s\n", moduleVersion(debug.ReadBuildInfo))
	return err
}

// moduleVersion is the module version the binary was built from, as "go
// install …@v1.2.3" records it, or "(devel)" for a build from a work tree,
// followed by the Go version.
func moduleVersion(read func() (*debug.BuildInfo, bool)) string {
	info, ok := read()
	if !ok {
		return "(devel)"
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	return v + " " + info.GoVersion
}

// topUsage prints the list of commands.
func (c *cli) topUsage(w io.Writer) {
	fmt.Fprint(w, `runlease operates run leases and concurrency slots.

Usage:
  runlease COMMAND [flags] [ARGUMENTS]

Commands:
`)
	tw := newTable(w)
	for _, cmd := range commands {
		fmt.Fprintf(tw, "  %s\t%s\n", cmd.name, cmd.summary)
	}
	tw.Flush()
	sets := c.flagSets()
	var withStore []string
	for _, cmd := range commands {
		if fs := sets[cmd.name]; fs != nil && fs.Lookup("postgres") != nil {
			withStore = append(withStore, cmd.name)
		}
	}
	fmt.Fprintf(w, "\nThe store (%s):\n", strings.Join(withStore, ", "))
	fmt.Fprint(w, `  --db PATH           the embedded SQLite store (default runlease.db)
  --postgres DSN      a shared Postgres store (default $RUNLEASE_POSTGRES): a
                      postgres:// URL or key=value pairs, as runlease.Open
                      reads them; table=NAME in the DSN names the table
  --table NAME        the Postgres table (default runlease_meta)
  --timeout DURATION  give up on the store after DURATION at each step
                      (default 10s)
`)
	for _, k := range c.kinds {
		name, usage := flag.UnquoteUsage(&flag.Flag{Name: k.Flag, Usage: k.Usage, Value: new(stringValue)})
		fmt.Fprintf(w, "  --%s %s\n                      %s", k.Flag, name, usage)
		if k.Env != "" {
			fmt.Fprintf(w, " (default $%s)", k.Env)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprint(w, `
Exit status: 0 success (peek: held), 1 error, 2 usage error (RUN-E001),
3 peek: free (expired or released), 4 peek: absent, 5 status: it shows a
corrupt row (named on stderr).

Run "runlease COMMAND --help" for a command's flags, and
"runlease --version" for the version.
`)
}

// exit prints err, if any, and returns the exit status it stands for.
func (c *cli) exit(err error) int {
	var st exitStatus
	var ue *usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &st):
		return int(st)
	case errors.As(err, &ue), errors.Is(err, runlease.ErrInvalidArgument):
		// RUN-E001, from the command line or the library, is a usage error:
		// the command was refused before it changed anything.
		c.printError(err)
		return exitUsage
	default:
		c.printError(err)
		return exitError
	}
}

// stringValue is a flag.Value of a string, for flag.UnquoteUsage.
type stringValue string

func (v *stringValue) String() string     { return string(*v) }
func (v *stringValue) Set(s string) error { *v = stringValue(s); return nil }
