package runlease_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/areev/runlease"
	"github.com/areev/runlease/internal/pgtest"
)

// pgRoleTable creates a login role on the test server whose sessions
// default to the given settings (ALTER ROLE … SET), and a fresh table with
// the store's schema that the role may read and write. It returns a DSN that
// connects as the role, and the table. Both are dropped when t ends. The
// role gets no privilege on a shared object, such as the public schema,
// whose catalog row concurrent tests would update at once.
func pgRoleTable(t *testing.T, admin *pgxpool.Pool, settings map[string]string) (dsn, table string) {
	t.Helper()
	role := pgtest.UniqueName("runlease_role_")
	id := pgx.Identifier{role}.Sanitize()
	run := func(sql string, args ...any) {
		t.Helper()
		_, err := admin.Exec(context.WithoutCancel(t.Context()), sql, args...)
		require.NoError(t, err, sql)
	}
	run("CREATE ROLE " + id + " LOGIN")
	t.Cleanup(func() {
		run("DROP OWNED BY " + id)
		run("DROP ROLE " + id)
	})
	table = pgtest.NewTable(t, admin)
	ddl, err := runlease.PostgresSchema(table)
	require.NoError(t, err)
	run(ddl)
	run("GRANT SELECT, INSERT, UPDATE, DELETE ON " + pgtest.Ident(table) + " TO " + id)
	for name, value := range settings {
		// ALTER ROLE takes no parameters; the name is an identifier and the
		// value a quoted literal.
		run(fmt.Sprintf("ALTER ROLE %s SET %s = '%s'", id, pgx.Identifier{name}.Sanitize(), value))
	}
	u, err := url.Parse(pgtest.DSN(t))
	require.NoError(t, err)
	u.User = url.User(role)
	return u.String(), table
}

// TestPostgresRacesAreLostNotFailedWhateverTheIsolation races conditional
// writes of one row under a role whose sessions default to a stricter
// isolation level than the store's READ COMMITTED, where a write that waited
// for a concurrent one would fail with a serialization failure (40001): each
// race must have exactly one winner and losers that get false, nil.
func TestPostgresRacesAreLostNotFailedWhateverTheIsolation(t *testing.T) {
	t.Parallel()
	admin := pgtest.Pool(t)
	for _, level := range []string{"repeatable read", "serializable"} {
		t.Run("a_role_defaulting_to_"+strings.ReplaceAll(level, " ", "_")+"_loses_races_without_errors", func(t *testing.T) {
			t.Parallel()
			dsn, table := pgRoleTable(t, admin, map[string]string{"default_transaction_isolation": level})
			requireSetting(t, dsn, "transaction_isolation", level)
			s := openPG(t, dsn, table)
			rounds := 20
			if testing.Short() {
				rounds = 8 // the count is for confidence only
			}
			for name, race := range pgRaces {
				for round := range rounds {
					key := fmt.Sprintf("%s-%d", name, round)
					wins := raceOnce(t, s, key, race)
					assert.Equal(t, 1, wins, "%s: winners of one race", key)
				}
			}
		})
	}
}

// pgRace is one kind of conditional write: setup prepares the row, and try is
// what each racer attempts with its own value.
type pgRace struct {
	setup func(t *testing.T, s *runlease.PostgresStore, key string)
	try   func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error)
}

var pgRaces = map[string]pgRace{
	"MetaCAS_insert": {
		try: func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error) {
			return s.MetaCAS(ctx, key, nil, value)
		},
	},
	"MetaCAS_update": {
		setup: putV,
		try: func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error) {
			return s.MetaCAS(ctx, key, strptr("v"), value)
		},
	},
	"MetaCASNotify_update": {
		setup: putV,
		try: func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error) {
			return s.MetaCASNotify(ctx, key, strptr("v"), value)
		},
	},
	"MetaDelete": {
		setup: putV,
		try: func(ctx context.Context, s *runlease.PostgresStore, key, _ string) (bool, error) {
			return s.MetaDelete(ctx, key, "v")
		},
	},
	"MetaBatch": {
		setup: putV,
		try: func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error) {
			return s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals(key, "v")},
				[]runlease.Op{runlease.Put(key, value), runlease.Put(key+"/"+value, "x")})
		},
	},
	"MetaCASMany": {
		setup: putV,
		try: func(ctx context.Context, s *runlease.PostgresStore, key, value string) (bool, error) {
			swapped, err := s.MetaCASMany(ctx, []runlease.CASWrite{{Key: key, Expected: strptr("v"), Value: value}})
			return err == nil && swapped[0], err
		},
	},
}

func putV(t *testing.T, s *runlease.PostgresStore, key string) {
	t.Helper()
	require.True(t, mustCAS(t, s, key, nil, "v"))
}

// raceOnce starts racers on key at once and returns how many won. Every
// racer must return without an error.
func raceOnce(t *testing.T, s *runlease.PostgresStore, key string, race pgRace) int {
	t.Helper()
	const racers = 6
	if race.setup != nil {
		race.setup(t, s, key)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	results := make([]bool, racers)
	errs := make([]error, racers)
	for i := range racers {
		wg.Go(func() {
			<-start
			results[i], errs[i] = race.try(t.Context(), s, key, fmt.Sprint("w", i))
		})
	}
	close(start)
	wg.Wait()
	wins := 0
	for i := range racers {
		require.NoError(t, errs[i], "%s: racer %d", key, i)
		if results[i] {
			wins++
		}
	}
	return wins
}

// TestPostgresPinsLeaveTheCallersConnectionsAsTheyWere proves that the
// settings the store pins for its own statements end with each call: on a
// pool whose one connection defaults to synchronous_commit = off and
// SERIALIZABLE, the connection still has both after every kind of call, and
// no call raised a notice (SET LOCAL outside a transaction block would warn,
// and the server would log it at every call).
func TestPostgresPinsLeaveTheCallersConnectionsAsTheyWere(t *testing.T) {
	t.Parallel()
	cfg, err := pgxpool.ParseConfig(pgtest.DSN(t))
	require.NoError(t, err)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	cfg.ConnConfig.RuntimeParams["default_transaction_isolation"] = "serializable"
	var notices atomic.Int64
	cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		notices.Add(1)
		t.Logf("notice: %s %s", n.Severity, n.Message)
	}
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	s := pgStore(t, pool)

	ctx := t.Context()
	require.True(t, mustCAS(t, s, "k", nil, "v1"))
	require.True(t, mustCAS(t, s, "k", strptr("v1"), "v2"))
	_, _, err = s.MetaGet(ctx, "k")
	require.NoError(t, err)
	_, err = s.MetaScan(ctx, "")
	require.NoError(t, err)
	_, err = s.MetaCASNotify(ctx, "n", nil, "v")
	require.NoError(t, err)
	_, err = s.MetaBatch(ctx, []runlease.Cond{runlease.IfEquals("k", "v2")}, []runlease.Op{runlease.Put("k", "v3")})
	require.NoError(t, err)
	_, err = s.MetaCASMany(ctx, []runlease.CASWrite{{Key: "k", Expected: strptr("v3"), Value: "v4"}})
	require.NoError(t, err)
	_, err = s.MetaDelete(ctx, "k", "v4")
	require.NoError(t, err)

	var syncCommit, isolation string
	require.NoError(t, pool.QueryRow(ctx, "SELECT current_setting('synchronous_commit'), current_setting('transaction_isolation')").
		Scan(&syncCommit, &isolation))
	assert.Equal(t, "off", syncCommit)
	assert.Equal(t, "serializable", isolation)
	assert.Zero(t, notices.Load(), "notices")
}
