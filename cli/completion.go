package cli

import (
	"errors"
	"flag"
	"io"
	"regexp"
	"slices"
	"strings"
	"text/template"
)

const completionHelp = `
Completion prints a script for SHELL, bash or zsh, that completes
runlease's commands, their flags, and the values of flags that take one of
a few words (-o text|json, --state); other values complete as file names.
It is generated from the commands and flags of this binary, the flags of
its further stores included.

  bash:  source <(runlease completion bash)   # in ~/.bashrc
  zsh:   source <(runlease completion zsh)    # in ~/.zshrc, after compinit
         or: runlease completion zsh > "${fpath[1]}/_runlease"
`

// completionShells are the shells completion writes scripts for.
var completionShells = []string{"bash", "zsh"}

func (c *cli) completion(args []string) error {
	fs := c.newFlags("completion", "SHELL", completionHelp)
	pos, err := c.parse(fs, args)
	switch {
	case err != nil:
		return err
	case len(pos) != 1 || !slices.Contains(completionShells, pos[0]):
		return usagef("completion", "want one shell, bash or zsh, got %q", strings.Join(pos, " "))
	}
	return completionScripts.ExecuteTemplate(c.stdout, pos[0], c.completionModel())
}

// completionModel is what the scripts complete.
type completionModel struct {
	Commands []string            // "help" and every command
	Flags    map[string][]string // each command's flags, as typed: "--db", "-o"
	Args     map[string][]string // the words a command takes as arguments
	Values   map[string][]string // the words a flag takes, by flag as typed
}

// completionModel reads the commands and the flag set of each.
func (c *cli) completionModel() completionModel {
	m := completionModel{Commands: []string{"help"}, Flags: map[string][]string{},
		Args:   map[string][]string{"completion": completionShells},
		Values: map[string][]string{}}
	for _, cmd := range commands {
		m.Commands = append(m.Commands, cmd.name)
	}
	m.Args["help"] = m.Commands[1:]
	for name, fs := range c.flagSets() {
		fs.VisitAll(func(f *flag.Flag) {
			if !shellWord.MatchString(f.Name) {
				return // a StoreKind's flag the script cannot quote plainly
			}
			typed := "--" + f.Name
			if len(f.Name) == 1 {
				typed = "-" + f.Name
			}
			m.Flags[name] = append(m.Flags[name], typed)
			if ch, ok := f.Value.(interface{ choices() []string }); ok {
				m.Values[typed] = ch.choices()
			}
		})
		m.Flags[name] = append(m.Flags[name], "--help")
	}
	return m
}

// shellWord is a word a script may hold unquoted.
var shellWord = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// errFlagsOnly ends a command run only for its flag set.
var errFlagsOnly = errors.New("flags only")

// flagSets returns the flag set of every command, by running each with a
// parse that hands its flag set over instead of parsing.
func (c *cli) flagSets() map[string]*cmdFlags {
	sets := map[string]*cmdFlags{}
	for _, cmd := range commands {
		probe := &cli{ctx: c.ctx, stdout: io.Discard, stderr: io.Discard, getenv: c.getenv,
			isTerminal: c.isTerminal, kinds: c.kinds}
		probe.flagsOnly = func(fs *cmdFlags) { sets[cmd.name] = fs }
		_ = cmd.run(probe, nil) // errFlagsOnly, once parse has the flag set
	}
	return sets
}

// choices are the words -o takes, for completion.
func (o outputFlag) choices() []string { return []string{outputText, outputJSON} }

// choices are the words --state takes, for completion.
func (s statesFlag) choices() []string {
	return []string{stateLive, stateExpired, stateReleased, stateCorrupt}
}

var completionScripts = template.Must(template.New("").Funcs(template.FuncMap{"join": strings.Join}).Parse(`
{{- define "bash" -}}
# bash completion for runlease; load it with: source <(runlease completion bash)
_runlease() {
	local cur=${COMP_WORDS[COMP_CWORD]} prev=${COMP_WORDS[COMP_CWORD-1]} flags= args=
	COMPREPLY=()
	if ((COMP_CWORD == 1)); then
		COMPREPLY=($(compgen -W '{{join .Commands " "}} --help --version' -- "$cur"))
		return
	fi
	case $prev in
{{- range $flag, $values := .Values}}
	{{$flag}}) COMPREPLY=($(compgen -W '{{join $values " "}}' -- "$cur")); return ;;
{{- end}}
	esac
	case ${COMP_WORDS[1]} in
{{- range $cmd, $flags := .Flags}}
	{{$cmd}}) flags='{{join $flags " "}}' ;;
{{- end}}
	esac
	case ${COMP_WORDS[1]} in
{{- range $cmd, $args := .Args}}
	{{$cmd}}) args='{{join $args " "}}' ;;
{{- end}}
	esac
	if [[ $cur == -* ]]; then
		COMPREPLY=($(compgen -W "$flags" -- "$cur"))
	else
		COMPREPLY=($(compgen -W "$args" -- "$cur"))
	fi
}
complete -o default -F _runlease runlease
{{end}}
{{- define "zsh" -}}
#compdef runlease
# zsh completion for runlease; load it with: source <(runlease completion zsh)
_runlease() {
	local -a flags args
	if ((CURRENT == 2)); then
		compadd -- {{join .Commands " "}} --help --version
		return
	fi
	case ${words[CURRENT-1]} in
{{- range $flag, $values := .Values}}
	{{$flag}}) compadd -- {{join $values " "}}; return ;;
{{- end}}
	esac
	case ${words[2]} in
{{- range $cmd, $flags := .Flags}}
	{{$cmd}}) flags=({{join $flags " "}}) ;;
{{- end}}
	esac
	case ${words[2]} in
{{- range $cmd, $args := .Args}}
	{{$cmd}}) args=({{join $args " "}}) ;;
{{- end}}
	esac
	if [[ $PREFIX == -* ]]; then
		compadd -- $flags
	elif (($#args)); then
		compadd -- $args
	else
		_files
	fi
}
if [[ $funcstack[1] == _runlease ]]; then
	_runlease "$@"
else
	compdef _runlease runlease
fi
{{end}}`))
