package cli

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// Nothing listens on port 1, so every open fails at once and its error
// comes back through the command's error path.
const (
	secretPW  = "s3cret-pw"
	secretDSN = "postgres://root:" + secretPW + "@127.0.0.1:1/test"
	secretKV  = "host=127.0.0.1 port=1 user=root password=" + secretPW + " dbname=test"
)

func TestDSNPasswordsAreNeverPrinted(t *testing.T) {
	t.Parallel()
	commands := [][]string{
		{"status"},
		{"status", "--json"},
		{"peek", "r1"},
		{"release", "r1", "--force", "--yes"},
		{"prune", "--older-than", "1h", "--yes"},
		{"prune", "--older-than", "1h", "--dry-run"},
	}
	for _, dsn := range []string{secretDSN, secretKV, "postgres://root@127.0.0.1:1/test?password=" + secretPW} {
		for _, args := range commands {
			r := runCLI(t, append(args, "--postgres", dsn)...)
			assert.Equal(t, exitError, r.code, args)
			assert.Regexp(t, `^runlease: RUN-E011: `, r.stderr)
			assert.NotContains(t, r.stdout+r.stderr, secretPW, args)

			r = session{env: map[string]string{envPostgres: dsn}}.run(t, args...)
			assert.Equal(t, exitError, r.code, "from $RUNLEASE_POSTGRES: %v", args)
			assert.Regexp(t, `^runlease: RUN-E011: `, r.stderr)
			assert.NotContains(t, r.stdout+r.stderr, secretPW, args)
		}
	}
}

func TestADSNInTheWrongPlaceIsRedactedToo(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "status", secretDSN)
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `unexpected argument "postgres://root@127.0.0.1:1/test"`, "named as status names a store")
	assert.NotContains(t, r.stderr, secretPW)

	r = runCLI(t, "peek", "--postgres", secretDSN)
	assert.Equal(t, exitUsage, r.code)
	assert.NotContains(t, r.stderr, secretPW)

	r = runCLI(t, "status", "--watch", "postgres://root:"+secretPW+"@h:1/d?port=x")
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, `invalid value "postgres (the DSN does not parse)" for flag -watch`)
	assert.NotContains(t, r.stderr, secretPW)
}

func TestRedact(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, dsn, in, want string }{
		{"a_DSN_is_printed_as_its_store_name", secretDSN, "dial " + secretDSN, "dial postgres://root@127.0.0.1:1/test"},
		{"a_password_alone_is_masked", secretDSN, "the server said " + secretPW, "the server said xxxxx"},
		{"a_key_value_DSN_is_printed_as_its_store_name", secretKV, secretKV, "postgres://root@127.0.0.1:1/test"},
		{"a_quoted_password_is_masked", "password='a b\\'c' host=x", "quoted a b'c here", "quoted xxxxx here"},
		{"an_encoded_password_is_masked_in_both_spellings", "postgres://u:p%40ss@h/d", "p@ss and p%40ss", "xxxxx and xxxxx"},
		{"a_short_password_stays_in_prose", "postgres://u:pw@h/d", "a short pw stays in prose", "a short pw stays in prose"},
		{"a_short_password_leaves_a_DSN", "postgres://u:pw@h/d", "postgres://u:pw@h/d", "postgres://u@h:5432/d"},
		{"another_DSN_loses_its_password_to_the_patterns", "postgres://u:pw@h/d", "postgres://v:other@g/e", "postgres://v:xxxxx@g/e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := newCLI(t.Context(), nil, nil, nil)
			c.getenv = func(string) string { return "" }
			c.collectSecrets([]string{"--postgres", tc.dsn})
			assert.Equal(t, tc.want, c.redact(tc.in), tc.dsn)
		})
	}
}
