package main

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// installFormatHCL renders the job as a Nomad jobspec with nomadjob.FormatHCL.
// FormatHCL prints the fields a revision job uses; the control-plane job uses
// a few more (spread, group update, workload identity, kill signal, shutdown
// delay). Rather than print a jobspec that silently drops one of them, it
// refuses and points at the JSON output, which is always exact.
func installFormatHCL(job *api.Job) ([]byte, error) {
	text, err := nomadjob.FormatHCL(job)
	if err != nil {
		return nil, err
	}
	if missing := installHCLMissing(job, string(text)); len(missing) > 0 {
		return nil, fmt.Errorf("the HCL formatter cannot print %s yet; use -format json (nomad job run -json accepts it)", strings.Join(missing, ", "))
	}
	return text, nil
}

// installHCLMissing lists the settings of job that text does not show.
func installHCLMissing(job *api.Job, text string) []string {
	has := func(block string) bool {
		return regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(block) + `\b`).MatchString(text)
	}
	var missing []string
	need := func(set bool, block string) {
		if set && !has(block) {
			missing = append(missing, block)
		}
	}
	for _, g := range job.TaskGroups {
		need(len(g.Spreads) > 0, "spread")
		need(g.Update != nil, "update")
		for _, t := range g.Tasks {
			need(t.Identity != nil, "identity")
			need(t.KillSignal != "", "kill_signal")
			need(t.ShutdownDelay != 0, "shutdown_delay")
		}
	}
	return missing
}
