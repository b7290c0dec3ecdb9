package cli

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// completer runs the bash completion script of one binary's command line.
type completer struct {
	bash, script string
}

func newCompleter(t *testing.T, kinds ...StoreKind) completer {
	t.Helper()
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash here to run the completion script with")
	}
	r := session{kinds: kinds}.run(t, "completion", "bash")
	require.Equal(t, exitOK, r.code, r.stderr)
	script := filepath.Join(t.TempDir(), "runlease.bash")
	require.NoError(t, os.WriteFile(script, []byte(r.stdout), 0o600))
	return completer{bash: bash, script: script}
}

// complete returns what bash offers for the last of words, as it would
// after "runlease words…<TAB>".
func (c completer) complete(t *testing.T, words ...string) []string {
	t.Helper()
	quoted := make([]string, len(words))
	for i, w := range words {
		quoted[i] = strconv.Quote(w) // no $ or ` in the words tested
	}
	prog := `source "$1" && complete -p runlease >/dev/null || exit 1
COMP_WORDS=(runlease ` + strings.Join(quoted, " ") + `) COMP_CWORD=` + strconv.Itoa(len(words)) + `
_runlease # fails when it offers nothing
printf '%s\n' "${COMPREPLY[@]}"`
	out, err := exec.CommandContext(t.Context(), c.bash, "--norc", "--noprofile", "-c", prog, "bash", c.script).CombinedOutput()
	require.NoError(t, err, string(out))
	return strings.Fields(string(out))
}

func TestBashCompletionCompletesCommandsFlagsAndTheirWords(t *testing.T) {
	t.Parallel()
	c := newCompleter(t)
	var names []string
	for _, cmd := range commands {
		names = append(names, cmd.name)
	}
	for _, tc := range []struct {
		name  string
		words []string
		want  []string
	}{
		{"every_command_first", []string{""}, append([]string{"help"}, append(names, "--help", "--version")...)},
		{"a_command_by_its_start", []string{"st"}, []string{"status"}},
		{"a_flag_by_its_start", []string{"status", "--wa"}, []string{"--watch"}},
		{"a_flag_after_an_argument", []string{"peek", "run-1", "--js"}, []string{"--json"}},
		{"the_output_formats", []string{"peek", "-o", ""}, []string{"text", "json"}},
		{"the_output_formats_long", []string{"explain", "--output", "j"}, []string{"json"}},
		{"the_lease_states", []string{"status", "--state", "ex"}, []string{"expired"}},
		{"the_shells", []string{"completion", ""}, []string{"bash", "zsh"}},
		{"a_command_to_help_with", []string{"help", "re"}, []string{"release", "repair"}},
		{"files_for_a_path", []string{"status", "--db", ""}, nil},
		{"files_for_a_run", []string{"peek", ""}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := c.complete(t, tc.words...)
			if tc.want == nil {
				assert.Empty(t, got, "nothing, so that bash completes file names")
				return
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

// helpFlag matches a flag line of a command's --help.
var helpFlag = regexp.MustCompile(`(?m)^  (?:(-\w), )?(--[\w-]+)`)

func TestBashCompletionOffersEveryFlagOfEveryCommand(t *testing.T) {
	t.Parallel()
	var opened []string
	kinds := []StoreKind{liteKind(&opened)}
	c := newCompleter(t, kinds...)
	for _, cmd := range commands {
		t.Run(cmd.name, func(t *testing.T) {
			t.Parallel()
			r := session{kinds: kinds}.run(t, cmd.name, "--help")
			require.Equal(t, exitOK, r.code, r.stderr)
			_, flags, _ := strings.Cut(r.stdout, "\nFlags:\n")
			var want []string
			for _, m := range helpFlag.FindAllStringSubmatch(flags, -1) {
				if m[1] != "" {
					want = append(want, m[1])
				}
				want = append(want, m[2])
			}
			require.Contains(t, want, "--help")
			assert.ElementsMatch(t, want, c.complete(t, cmd.name, "-"))
		})
	}
	assert.Contains(t, c.complete(t, "status", "--li"), "--lite", "a StoreKind's flag")
	assert.Contains(t, c.complete(t, "status", "--li"), "--lite-tag", "a StoreKind's further flag")
}

func TestZshCompletionNamesEveryCommandAndFlag(t *testing.T) {
	t.Parallel()
	r := runCLI(t, "completion", "zsh")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.True(t, strings.HasPrefix(r.stdout, "#compdef runlease\n"), r.stdout)
	assert.Contains(t, r.stdout, "compdef _runlease runlease")
	for _, cmd := range commands {
		assert.Regexp(t, `(?m)^\t`+cmd.name+`\) flags=\(.*--help\) ;;$`, r.stdout)
	}
	assert.Contains(t, r.stdout, "\tstatus) flags=(--db --json --limit --max -o --output ")
	assert.Contains(t, r.stdout, "\t-o) compadd -- text json; return ;;")
}

func TestZshCompletionCompletesCommandsFlagsAndTheirWords(t *testing.T) {
	t.Parallel()
	zsh, err := exec.LookPath("zsh")
	if err != nil {
		t.Skip("no zsh here to run the completion script with")
	}
	r := runCLI(t, "completion", "zsh")
	require.Equal(t, exitOK, r.code, r.stderr)
	script := filepath.Join(t.TempDir(), "_runlease")
	require.NoError(t, os.WriteFile(script, []byte(r.stdout), 0o600))
	// compadd and _files stand in for zsh's completion system: they print
	// what the script offers, before zsh would match it against PREFIX.
	complete := func(prefix string, words ...string) []string {
		prog := `compdef() { print -r -- "compdef $*" }
compadd() { [[ $1 == -- ]] && shift; print -rl -- "$@" }
_files() { print -r -- FILES }
source "$1" || exit 1
shift
words=(runlease "$@") CURRENT=$(($# + 1)) PREFIX=$PREFIX_
_runlease`
		cmd := exec.CommandContext(t.Context(), zsh, append([]string{"-f", "-c", prog, "zsh", script}, words...)...)
		cmd.Env = append(os.Environ(), "PREFIX_="+prefix)
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, string(out))
		return strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	assert.Equal(t, "compdef _runlease runlease", complete("", "")[0], "sourced, it registers itself")
	assert.Contains(t, complete("", ""), "explain")
	assert.Contains(t, complete("--w", "status", "--w"), "--watch")
	assert.Contains(t, complete("-", "peek", "r1", "-"), "-o")
	assert.Equal(t, []string{"text", "json"}, complete("", "peek", "-o", "")[1:])
	assert.Equal(t, []string{"live", "expired", "released", "corrupt"}, complete("", "status", "--state", "")[1:])
	assert.Equal(t, []string{"bash", "zsh"}, complete("", "completion", "")[1:])
	assert.Equal(t, []string{"FILES"}, complete("", "status", "--db", "")[1:])
	assert.Equal(t, []string{"FILES"}, complete("", "peek", "")[1:])

	// Installed as _runlease in a directory of $fpath, compinit finds it.
	out, err := exec.CommandContext(t.Context(), zsh, "-f", "-c", `fpath=("$1" $fpath)
autoload -U compinit && compinit -u -D && print -r -- "$_comps[runlease]"`, "zsh", filepath.Dir(script)).CombinedOutput()
	require.NoError(t, err, string(out))
	assert.Equal(t, "_runlease\n", string(out))
}

func TestCompletionRefusesAnUnknownShell(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"completion"}, {"completion", "fish"}, {"completion", "bash", "zsh"}} {
		r := runCLI(t, args...)
		assert.Equal(t, exitUsage, r.code, args)
		assert.Regexp(t, `^runlease: RUN-E001: completion: want one shell, bash or zsh`, r.stderr, args)
		assert.Empty(t, r.stdout, args)
	}
}
