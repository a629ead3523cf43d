package main

import (
	"flag"
	"fmt"
	"strings"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
)

// hclflags holds the -var and -var-file flags shared by the commands that
// read service files (validate, render, deploy).
type hclflags struct {
	vars     map[string]string
	varFiles []string
}

// addVarFlags registers -var name=value and -var-file path on fs, both
// repeatable; a later -var for the same name wins.
func addVarFlags(fs *flag.FlagSet) *hclflags {
	h := &hclflags{vars: map[string]string{}}
	fs.Func("var", "set a variable of the service file: `name=value` (repeatable)", func(s string) error {
		name, value, ok := strings.Cut(s, "=")
		if !ok || strings.TrimSpace(name) == "" {
			return fmt.Errorf("want name=value, for example -var image=nginx:1.27")
		}
		h.vars[strings.TrimSpace(name)] = value
		return nil
	})
	fs.Func("var-file", "read variables from an HCL `file` of name = value lines (repeatable)", func(s string) error {
		if s == "" {
			return fmt.Errorf("want a file path")
		}
		h.varFiles = append(h.varFiles, s)
		return nil
	})
	return h
}

// Options are the parser options the flags and getenv (for
// NOMAD_SERVERLESS_VAR_<name>) give.
func (h *hclflags) Options(getenv func(string) string) svchcl.Options {
	vars := make(map[string]string, len(h.vars))
	for k, v := range h.vars {
		vars[k] = v
	}
	return svchcl.Options{
		Vars:     vars,
		VarFiles: append([]string(nil), h.varFiles...),
		Getenv:   getenv,
	}
}

// parseFlagsAnywhere parses fs from args allowing flags after positional
// arguments (validate a.hcl -var x=1), as users of the nomad CLI expect, and
// returns the positional arguments. Everything after "--" is positional.
func parseFlagsAnywhere(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return positional, nil
		}
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(positional, rest...), nil
		}
		positional = append(positional, rest[0])
		args = rest[1:]
	}
}

// newFlagSet is a command's flag set: errors and help on stderr, help being
// usage (the synopsis and what the command does) then the flags.
func newFlagSet(e *env, name, usage string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprint(e.stderr, usage)
		fs.PrintDefaults()
	}
	return fs
}

// serviceArg parses the flags of a command that takes one service name,
// flags before or after it. ok is false when the arguments are wrong, after
// the flag package or the usage said so on stderr.
func serviceArg(fs *flag.FlagSet, args []string) (service string, ok bool) {
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return "", false
	}
	if len(rest) != 1 {
		fs.Usage()
		return "", false
	}
	return rest[0], true
}
