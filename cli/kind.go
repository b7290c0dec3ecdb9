package cli

import (
	"context"
	"flag"
	"fmt"
	"regexp"

	"github.com/areev/runlease"
)

// A StoreKind adds a kind of store to the command line beyond the embedded
// and Postgres ones: a store of a module the core module does not depend
// on, such as etcdstore's. A binary built with it gains a flag that names
// such a store on every command that opens one (status, peek, explain,
// serve, release, repair, prune), and an environment variable read when no
// store flag is given:
//
//	func main() { os.Exit(cli.Main(os.Args[1:], etcdKind)) }
//
// etcdstore/cmd/runlease is such a binary.
type StoreKind struct {
	// Flag is the flag's name, without dashes, such as "etcd". It must not
	// be a flag the commands already have.
	Flag string
	// Env names the environment variable read for Flag's value when no
	// store flag is given and $RUNLEASE_POSTGRES is empty; "" for none.
	Env string
	// Usage is the flag's help text; a name in backquotes names its value,
	// as in the flag package.
	Usage string
	// Register, called once for each command line, may add further flags
	// of the store to fs (such as a key prefix, named after Flag) and
	// returns the function that opens the store. A further flag given
	// without Flag is refused as a usage error. Register must not be nil.
	Register func(fs *flag.FlagSet) Opener
}

// An Opener opens the store that value (the value of a StoreKind's flag, or
// of its environment variable) names, within ctx, which ends after the
// command's --timeout. name names the store to an operator in every report
// and on the status page; it must not hold a password. The store is closed
// when the command is done with it. An error that matches
// [runlease.ErrInvalidArgument] is reported as a usage error (exit status
// 2).
type Opener func(ctx context.Context, value string) (s runlease.ClosableStore, name string, err error)

// flagName is what a StoreKind's Flag may be.
var flagName = regexp.MustCompile(`^[a-z][a-z0-9-]*$`)

// builtinFlags are the flags of the built-in stores and of the commands
// that open stores, which no StoreKind may take.
var builtinFlags = map[string]bool{"db": true, "postgres": true, "table": true, "timeout": true,
	"allow-force-release": true, "dry-run": true, "fence": true, "fence-unknown": true, "force": true,
	"json": true, "o": true, "output": true, "limit": true, "listen": true, "listen-any": true, "max": true, "older-than": true,
	"run": true, "slot": true, "state": true, "watch": true, "yes": true, "help": true, "h": true,
	"units": true, "priority": true, "principal": true, "weight": true}

// addKinds checks kinds and keeps them for the commands.
func (c *cli) addKinds(kinds []StoreKind) error {
	seen := map[string]bool{}
	for _, k := range kinds {
		switch {
		case !flagName.MatchString(k.Flag):
			return fmt.Errorf("%w: store kind flag %q: want lower-case letters, digits and dashes",
				runlease.ErrInvalidArgument, k.Flag)
		case builtinFlags[k.Flag] || seen[k.Flag]:
			return fmt.Errorf("%w: store kind flag --%s is taken", runlease.ErrInvalidArgument, k.Flag)
		case k.Register == nil:
			return fmt.Errorf("%w: store kind --%s has no Register", runlease.ErrInvalidArgument, k.Flag)
		}
		seen[k.Flag] = true
	}
	c.kinds = kinds
	return nil
}
