package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/areev/runlease"
)

// envPostgres names the environment variable that selects a Postgres store
// when neither --db nor --postgres is given.
const envPostgres = "RUNLEASE_POSTGRES"

// defaultDB is the embedded store's file when no store is named.
const defaultDB = "runlease.db"

// lockedHint is the advice printed under a store-locked error.
const lockedHint = "stop the driver or use a shared Postgres store"

// defaultTimeout is --timeout's default: how long a command waits for its
// store at each step (connecting, one read, one write).
const defaultTimeout = 10 * time.Second

// storeFlags are the flags that choose a store.
type storeFlags struct {
	db, postgres, table string
	timeout             time.Duration
	kinds               []*kindFlags // the flags of the stores added by StoreKinds
}

// kindFlags are one StoreKind's flags on one command line.
type kindFlags struct {
	kind  StoreKind
	value string   // the value of its flag
	open  Opener   // what its Register returned
	other []string // the names of the other flags Register added
}

// registerStore adds the store flags, those of c's StoreKinds included, to
// fs.
func (c *cli) registerStore(fs *flag.FlagSet, sf *storeFlags) {
	fs.StringVar(&sf.db, "db", defaultDB, "the embedded SQLite store's `PATH`")
	fs.StringVar(&sf.postgres, "postgres", "", "a shared Postgres store's `DSN`, a URL or key=value pairs (default $"+envPostgres+")")
	fs.StringVar(&sf.table, "table", runlease.DefaultPostgresTable, "the Postgres store's table `NAME` (or table= in the DSN)")
	fs.DurationVar(&sf.timeout, "timeout", defaultTimeout, "give up on the store after `DURATION` at each step, such as connecting")
	for _, k := range c.kinds {
		kf := &kindFlags{kind: k}
		fs.StringVar(&kf.value, k.Flag, "", k.Usage)
		had := map[string]bool{}
		fs.VisitAll(func(f *flag.Flag) { had[f.Name] = true })
		if k.Register != nil {
			kf.open = k.Register(fs)
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !had[f.Name] {
				kf.other = append(kf.other, f.Name)
			}
		})
		sf.kinds = append(sf.kinds, kf)
	}
}

// step returns a context for one step of a command's work with its store,
// bounded by --timeout. A prompt is not a step: an operator may take longer
// to answer than the store may to reply.
func (c *cli) step(sf *storeFlags) (context.Context, context.CancelFunc) {
	return context.WithTimeout(c.ctx, sf.timeout)
}

// storeAccess says what a command does with its store.
type storeAccess int

const (
	// readOnly opens an embedded store without its writer lock, beside a
	// running driver, and never creates one.
	readOnly storeAccess = iota
	// readWrite takes the embedded store's writer lock.
	readWrite
)

// openedStore is a store and how to name it to an operator.
type openedStore struct {
	s      runlease.Store   // passed to the library as is, so its Clock is seen
	name   string           // "sqlite:PATH", the Postgres store as postgresName names it, or as a StoreKind does
	table  string           // the Postgres table; "" for any other store
	target *runlease.Target // the built-in store's target; nil for a StoreKind's
	close  func() error
}

// now returns the time by which the store judges expiry: its own clock
// when it has one (Postgres: the server's), else this machine's.
func (o *openedStore) now() time.Time {
	if c, ok := o.s.(runlease.Clock); ok {
		now, _ := c.ClockNow()
		return now
	}
	return time.Now()
}

// resolve checks the store flags against each other and the environment,
// and returns the store they name, parsed as runlease.Open parses a target.
// A Postgres target never creates its table: an operator's tool reads and
// repairs the store that drivers made.
func (c *cli) resolve(fs *flag.FlagSet, sf *storeFlags, access storeAccess) (runlease.Target, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if sf.timeout <= 0 {
		return runlease.Target{}, usagef(fs.Name(), "--timeout %v: give a positive duration, such as 10s", sf.timeout)
	}
	dsn := sf.postgres
	switch {
	case set["postgres"] && set["db"]:
		return runlease.Target{}, usagef(fs.Name(), "--db and --postgres name two stores; give one")
	}
	if dsn == "" && !set["db"] {
		dsn = c.getenv(envPostgres)
	}
	if dsn == "" && set["table"] {
		return runlease.Target{}, usagef(fs.Name(), "--table applies to a Postgres store (--postgres or $%s)", envPostgres)
	}
	if set["postgres"] && dsn == "" {
		return runlease.Target{}, usagef(fs.Name(), "--postgres needs a DSN")
	}
	if dsn == "" {
		return runlease.Target{Kind: runlease.TargetSQLite, Path: sf.db, ReadOnly: access == readOnly}, nil
	}
	t, err := runlease.ParseTarget(dsn)
	switch {
	case err != nil:
		return runlease.Target{}, err
	case t.Kind != runlease.TargetPostgres:
		return runlease.Target{}, usagef(fs.Name(), "--postgres wants a postgres:// URL or key=value pairs; "+
			"give an embedded store with --db PATH")
	case set["table"] && t.Table != runlease.DefaultPostgresTable && t.Table != sf.table:
		return runlease.Target{}, usagef(fs.Name(), "--table %q and the DSN's table=%q name two tables; give one", sf.table, t.Table)
	case set["table"]:
		t.Table = sf.table
		if _, err := runlease.PostgresSchema(t.Table); err != nil {
			return runlease.Target{}, err
		}
	}
	t.CreateTable = false
	return t, nil
}

// open opens the store the flags name, within one --timeout.
func (c *cli) open(fs *flag.FlagSet, sf *storeFlags, access storeAccess) (*openedStore, error) {
	kf, value, err := c.chooseKind(fs, sf)
	if err != nil {
		return nil, err
	}
	if kf != nil {
		ctx, cancel := c.step(sf)
		defer cancel()
		return c.openKind(ctx, kf, value, sf.timeout)
	}
	t, err := c.resolve(fs, sf, access)
	if err != nil {
		return nil, err
	}
	if t.Kind == runlease.TargetSQLite {
		if err := notDirectory(fs.Name(), t.Path); err != nil {
			return nil, err
		}
	}
	ctx, cancel := c.step(sf)
	defer cancel()
	var o *openedStore
	if t.Kind == runlease.TargetPostgres {
		o, err = c.openPostgres(ctx, t, sf.timeout)
	} else {
		o, err = openSQLite(ctx, t)
	}
	if o != nil {
		o.target = &t
	}
	return o, err
}

// chooseKind returns the StoreKind the command line names, with its value:
// its flag, or else its environment variable when no built-in store is
// named either way. It returns nil for a built-in store.
func (c *cli) chooseKind(fs *flag.FlagSet, sf *storeFlags) (*kindFlags, string, error) {
	if len(sf.kinds) == 0 {
		return nil, "", nil
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var named []string // the stores named by flags
	for _, f := range []string{"db", "postgres"} {
		if set[f] {
			named = append(named, "--"+f)
		}
	}
	var chosen *kindFlags
	value := ""
	for _, kf := range sf.kinds {
		if set[kf.kind.Flag] {
			named = append(named, "--"+kf.kind.Flag)
			chosen, value = kf, kf.value
		}
	}
	if len(named) > 1 {
		return nil, "", usagef(fs.Name(), "%s name two stores; give one", strings.Join(named, " and "))
	}
	if len(named) == 0 && c.getenv(envPostgres) == "" {
		var envs []string
		for _, kf := range sf.kinds {
			if v := c.getenv(kf.kind.Env); kf.kind.Env != "" && v != "" {
				envs = append(envs, "$"+kf.kind.Env)
				chosen, value = kf, v
			}
		}
		if len(envs) > 1 {
			return nil, "", usagef(fs.Name(), "%s name two stores; give one of them, or a store flag", strings.Join(envs, " and "))
		}
	}
	for _, kf := range sf.kinds {
		if kf == chosen {
			continue
		}
		for _, f := range kf.other {
			if set[f] {
				return nil, "", usagef(fs.Name(), "--%s applies to the store of --%s", f, kf.kind.Flag)
			}
		}
	}
	if chosen == nil {
		return nil, "", nil
	}
	switch {
	case sf.timeout <= 0:
		return nil, "", usagef(fs.Name(), "--timeout %v: give a positive duration, such as 10s", sf.timeout)
	case set["table"]:
		return nil, "", usagef(fs.Name(), "--table applies to a Postgres store (--postgres or $%s)", envPostgres)
	case value == "":
		return nil, "", usagef(fs.Name(), "--%s needs a value", chosen.kind.Flag)
	case chosen.open == nil:
		return nil, "", usagef(fs.Name(), "--%s: this build cannot open that store", chosen.kind.Flag)
	}
	return chosen, value, nil
}

// openKind opens the store of a StoreKind.
func (c *cli) openKind(ctx context.Context, kf *kindFlags, value string, timeout time.Duration) (*openedStore, error) {
	s, name, err := kf.open(ctx, value)
	switch {
	case errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil:
		return nil, withHint(err, fmt.Sprintf("nothing answered within --timeout %v: check the --%s value, and "+
			"that the servers are up, or give a longer --timeout", timeout, kf.kind.Flag))
	case err != nil:
		return nil, err
	}
	return &openedStore{s: s, name: name, close: s.Close}, nil
}

func (c *cli) openPostgres(ctx context.Context, t runlease.Target, timeout time.Duration) (*openedStore, error) {
	s, err := t.Open(ctx)
	switch {
	case errors.Is(err, runlease.ErrSchemaMismatch):
		return nil, withHint(err, "runlease never creates or changes the table; "+
			"drivers create it, or run the DDL of \"runlease schema --table NAME\"")
	case errors.Is(err, context.DeadlineExceeded) && c.ctx.Err() == nil:
		return nil, withHint(err, fmt.Sprintf("nothing answered within --timeout %v: check the host and "+
			"port, and that the server is up, or give a longer --timeout", timeout))
	case err != nil:
		return nil, err
	}
	return &openedStore{s: s, name: postgresName(t.DSN, t.Table), table: t.Table, close: s.Close}, nil
}

// openSQLite opens the embedded store t names, which must exist: neither a
// read nor a repair has any use for a new, empty store.
func openSQLite(ctx context.Context, t runlease.Target) (*openedStore, error) {
	_, err := os.Stat(t.Path)
	var s runlease.ClosableStore
	if err == nil {
		s, err = t.Open(ctx)
	}
	switch {
	case errors.Is(err, runlease.ErrStoreLocked):
		return nil, withHint(err, lockedHint)
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: no embedded store at %q (runlease never creates one "+
			"here; give --db PATH or --postgres DSN)", runlease.CodeStorage, t.Path)
	case err != nil:
		return nil, err
	}
	return &openedStore{s: s, name: "sqlite:" + t.Path, close: s.Close}, nil
}

// notDirectory refuses a --db that names a directory, which SQLite would
// refuse in terms of the file it expected there (its hard links), and says
// which file to give instead.
func notDirectory(cmd, path string) error {
	st, err := os.Stat(path)
	if err != nil || !st.IsDir() {
		return nil
	}
	file := filepath.Join(path, defaultDB)
	exists := ""
	if st, err := os.Stat(file); err == nil && st.Mode().IsRegular() {
		exists = ", which exists"
	}
	return usagef(cmd, "--db %q is a directory; --db names the store's file, such as %q%s", path, file, exists)
}

// at returns a clock option fixed at now, so that every row of one report
// is judged at the same instant.
func at(now time.Time) runlease.Option {
	return runlease.WithClock(func() time.Time { return now })
}
