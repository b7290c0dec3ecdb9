// Command runlease is the operator's tool for runlease stores: it shows
// which driver holds which run and until when, how full the concurrency
// slots are, force-releases a stuck lease, repairs a corrupt row, prunes
// old rows, prints the Postgres schema, and plays a short demo of the
// library. It names stores as runlease.Open does.
//
//	go run ./cmd/runlease demo
//	runlease status --db runs.db
//	runlease peek run-42 --postgres "$DSN"; echo $?   # 0 held, 3 free, 4 absent
//	runlease repair run-7 --fence 18                  # a corrupt row: a tombstone at fence 18
//	runlease status -o json                           # JSON for scripts, as --json
//	source <(runlease completion bash)                # or zsh
//	runlease version                                  # v0.1.0 after go install …@v0.1.0
//
// Run "runlease help" for the commands and "runlease <command> --help" for
// each command's flags.
package main

import (
	"os"

	"github.com/areev/runlease/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:])) }
