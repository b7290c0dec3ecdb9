package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
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

// storeFlags are the flags that choose a store.
type storeFlags struct {
	db, postgres, table string
}

func (sf *storeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&sf.db, "db", defaultDB, "the embedded SQLite store's `PATH`")
	fs.StringVar(&sf.postgres, "postgres", "", "a shared Postgres store's `DSN` (default $"+envPostgres+")")
	fs.StringVar(&sf.table, "table", runlease.DefaultPostgresTable, "the Postgres store's table `NAME`")
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
	s     runlease.Store // passed to the library as is, so its Clock is seen
	name  string         // "sqlite:PATH", or the Postgres store as postgresName names it
	close func() error
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

// resolve checks the store flags against each other and the environment.
// It returns the Postgres DSN, or "" for the embedded store at sf.db.
func (c *cli) resolve(fs *flag.FlagSet, sf *storeFlags) (string, error) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	dsn := sf.postgres
	if set["postgres"] && set["db"] {
		return "", usagef(fs.Name(), "--db and --postgres name two stores; give one")
	}
	if dsn == "" && !set["db"] {
		dsn = c.getenv(envPostgres)
	}
	if dsn == "" && set["table"] {
		return "", usagef(fs.Name(), "--table applies to a Postgres store (--postgres or $%s)", envPostgres)
	}
	if set["postgres"] && dsn == "" {
		return "", usagef(fs.Name(), "--postgres needs a DSN")
	}
	return dsn, nil
}

// open opens the store the flags name. Neither access creates a Postgres
// table: an operator's tool reads and repairs the store that drivers made.
func (c *cli) open(ctx context.Context, fs *flag.FlagSet, sf *storeFlags, access storeAccess) (*openedStore, error) {
	dsn, err := c.resolve(fs, sf)
	if err != nil {
		return nil, err
	}
	if dsn != "" {
		return c.openPostgres(ctx, dsn, sf.table)
	}
	return openSQLite(sf.db, access)
}

func (c *cli) openPostgres(ctx context.Context, dsn, table string) (*openedStore, error) {
	s, err := runlease.OpenPostgres(ctx, dsn, runlease.WithTable(table), runlease.WithCreateTable(false))
	if errors.Is(err, runlease.ErrSchemaMismatch) {
		return nil, withHint(err, "runlease never creates or changes the table; "+
			"drivers create it, or run the DDL of \"runlease schema --table NAME\"")
	}
	if err != nil {
		return nil, err
	}
	return &openedStore{s: s, name: postgresName(dsn, table), close: s.Close}, nil
}

// openSQLite opens the embedded store at path, which must exist: neither a
// read nor a repair has any use for a new, empty store.
func openSQLite(path string, access storeAccess) (*openedStore, error) {
	_, err := os.Stat(path)
	var s *runlease.SQLiteStore
	if err == nil && access == readOnly {
		s, err = runlease.OpenSQLiteReadOnly(path)
	} else if err == nil {
		s, err = runlease.OpenSQLite(path)
	}
	switch {
	case errors.Is(err, runlease.ErrStoreLocked):
		return nil, withHint(err, lockedHint)
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: no embedded store at %q (runlease never creates one "+
			"here; give --db PATH or --postgres DSN)", runlease.CodeStorage, path)
	case err != nil:
		return nil, err
	}
	return &openedStore{s: s, name: "sqlite:" + path, close: s.Close}, nil
}

// at returns a clock option fixed at now, so that every row of one report
// is judged at the same instant.
func at(now time.Time) runlease.Option {
	return runlease.WithClock(func() time.Time { return now })
}
