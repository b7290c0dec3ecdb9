package cli

import "fmt"

// Output formats, as -o and --output spell them.
const (
	outputText = "text"
	outputJSON = "json"
)

// outputFlag is -o/--output FORMAT, as kubectl and etcdctl spell it: text
// (the default) or json, the same switch as --json. The last of them
// given wins, as for any flag given twice.
type outputFlag struct{ json *bool }

func (o outputFlag) String() string {
	if o.json != nil && *o.json {
		return outputJSON
	}
	return outputText
}

func (o outputFlag) Set(s string) error {
	switch s {
	case outputText:
		*o.json = false
	case outputJSON:
		*o.json = true
	default:
		return fmt.Errorf("want %s or %s", outputText, outputJSON)
	}
	return nil
}

// outputVars adds --json and -o/--output FORMAT to fs, both setting
// asJSON.
func (fs *cmdFlags) outputVars(asJSON *bool, jsonUsage string) {
	fs.BoolVar(asJSON, "json", false, jsonUsage+"; the same as -o json")
	o := outputFlag{json: asJSON}
	fs.Var(o, "output", "print the output as `FORMAT`: text or json")
	fs.Var(o, "o", "")
	fs.short["output"] = "o"
}
