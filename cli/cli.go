package cli

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/areev/runlease"
)

// cli is one invocation of the command: its streams and the seams tests
// replace (the environment, and whether stdin is a terminal).
type cli struct {
	ctx            context.Context // ends on SIGINT or SIGTERM
	stdin          *bufio.Reader
	rawStdin       io.Reader
	rawStdout      io.Writer
	stdout, stderr io.Writer
	getenv         func(string) string
	isTerminal     func(stream any) bool
	secrets        []string          // passwords found in DSNs: never printed
	dsns           *strings.Replacer // the DSNs of the command line, by the names printed instead
	kinds          []StoreKind       // stores beyond the built-in ones
	// flagsOnly, when set, is handed each flag set parse is given, which
	// then ends the command with errFlagsOnly: completion reads the flags
	// of every command this way.
	flagsOnly func(*cmdFlags)
}

func newCLI(ctx context.Context, stdin io.Reader, stdout, stderr io.Writer) *cli {
	c := &cli{ctx: ctx, rawStdin: stdin, rawStdout: stdout, stdin: bufio.NewReader(stdin),
		getenv: os.Getenv, isTerminal: isTerminal}
	c.stdout = &redactingWriter{w: stdout, c: c}
	c.stderr = &redactingWriter{w: stderr, c: c}
	return c
}

// usageError is a wrong command line: exit status 2.
type usageError struct {
	cmd string
	msg string
}

func (e *usageError) Error() string {
	help := "runlease help"
	prefix := ""
	if e.cmd != "" {
		help = "runlease " + e.cmd + " --help"
		prefix = e.cmd + ": "
	}
	return fmt.Sprintf("%s: %s%s (see %s)", runlease.CodeInvalidArgument, prefix, e.msg, help)
}

func usagef(cmd, format string, a ...any) error {
	return &usageError{cmd: cmd, msg: fmt.Sprintf(format, a...)}
}

// exitStatus ends a command with a status and nothing printed: --help, and
// peek's answers.
type exitStatus int

func (s exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(s)) }

// hintError adds a second line, advice for the operator, to an error.
type hintError struct {
	err  error
	hint string
}

func (e *hintError) Error() string { return e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

func withHint(err error, hint string) error { return &hintError{err: err, hint: hint} }

// printError prints err as one line starting with its code, and its hint,
// if any, on the next.
func (c *cli) printError(err error) {
	fmt.Fprintf(c.stderr, "runlease: %s\n", oneLine(err.Error()))
	var h *hintError
	if errors.As(err, &h) {
		fmt.Fprintf(c.stderr, "runlease: hint: %s\n", h.hint)
	}
}

// oneLine folds a multi-line message (errors.Join and drivers make them)
// onto one line.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, ":\n", ": ")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", "; ")), " ")
}

// cmdFlags is a command's flag set and the text of its --help.
type cmdFlags struct {
	*flag.FlagSet
	usage, description string
	short              map[string]string // a long flag's one-letter alias: "output" -> "o"
}

// newFlags returns the flag set of cmd, whose --help prints the usage line,
// the description and the flags.
func (c *cli) newFlags(cmd, usage, description string) *cmdFlags {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	// parse reports errors and prints the help itself: the flag package
	// would print the whole help for every mistyped flag.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &cmdFlags{FlagSet: fs, usage: usage, description: strings.TrimSpace(description),
		short: map[string]string{}}
}

// printHelp prints the help of fs to stdout.
func (c *cli) printHelp(fs *cmdFlags) {
	fmt.Fprintf(c.stdout, "Usage: %s\n\n%s\n\nFlags:\n", strings.TrimSpace("runlease "+fs.Name()+" "+fs.usage), fs.description)
	aliases := map[string]bool{}
	for _, s := range fs.short {
		aliases[s] = true
	}
	tw := newTable(c.stdout)
	fs.VisitAll(func(f *flag.Flag) {
		if aliases[f.Name] {
			return // shown beside its long name
		}
		name, usage := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + name
		}
		if showDefault(f) {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		flags := "--" + f.Name
		if s, ok := fs.short[f.Name]; ok {
			flags = "-" + s + ", " + flags
		}
		fmt.Fprintf(tw, "  %s%s\t%s\n", flags, name, usage)
	})
	fmt.Fprintf(tw, "  --help\tshow this help\n")
	tw.Flush()
}

// showDefault reports whether f's help shows its default: not when it is
// a zero value, which means "not given" (as the flag package decides), as
// for every flag a command requires (--fence, --older-than): a default
// there would suggest that it may be left out.
func showDefault(f *flag.Flag) bool {
	switch f.DefValue {
	case "", "false", "0", "0s":
		return false
	}
	return true
}

// parse parses args with fs, allowing flags after positional arguments
// ("peek RUN --json"); everything after "--" is positional. It returns the
// positional arguments, or exitStatus(0) after printing help.
func (c *cli) parse(fs *cmdFlags, args []string) ([]string, error) {
	if c.flagsOnly != nil {
		c.flagsOnly(fs)
		return nil, errFlagsOnly
	}
	var pos []string
	for {
		err := fs.Parse(args)
		if errors.Is(err, flag.ErrHelp) {
			c.printHelp(fs)
			return nil, exitStatus(exitOK)
		}
		if err != nil {
			return nil, usagef(fs.Name(), "%v", err)
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if i := len(args) - len(rest); i > 0 && args[i-1] == "--" {
			return append(pos, rest...), nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
}

// confirm asks question on the terminal and reports whether the answer was
// yes. It does not ask, and says yes, when stdin is not a terminal: scripts
// have already said --force or chosen the command. An interrupt (which
// run catches) or the end of input is a no.
func (c *cli) confirm(question string) bool {
	if !c.isTerminal(c.rawStdin) {
		return true
	}
	fmt.Fprintf(c.stdout, "%s [y/N] ", question)
	// Read aside, so that an interrupt is not stuck behind a blocked read;
	// the process exits right after, so the reader is not left behind long.
	answer := make(chan string, 1)
	go func() {
		line, _ := c.stdin.ReadString('\n')
		answer <- line
	}()
	select {
	case line := <-answer:
		if !strings.HasSuffix(line, "\n") {
			fmt.Fprintln(c.stdout)
		}
		switch strings.ToLower(strings.TrimSpace(line)) {
		case "y", "yes":
			return true
		}
	case <-c.ctx.Done():
		fmt.Fprintln(c.stdout)
	}
	return false
}

// errAborted is the answer "no" to a confirmation.
var errAborted = errors.New("aborted at the prompt; nothing was changed")

// isTerminal reports whether stream is a terminal: a character device other
// than the null device (which is how cron and CI hand a program no input).
func isTerminal(stream any) bool {
	f, ok := stream.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	if err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return false
	}
	null, err := os.Stat(os.DevNull)
	return err != nil || !os.SameFile(st, null)
}

// newTable returns a tabwriter for aligned columns.
func newTable(w io.Writer) *tabwriter.Writer {
	return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
}
