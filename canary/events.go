package canary

import "time"

// EventKind says what happened to a rollout.
type EventKind string

const (
	// EventWaking: the new revision has no ready instance, and the
	// machine asks for it to be woken before the first step.
	EventWaking EventKind = "waking"
	// EventStepStarted: the route now holds a new step.
	EventStepStarted EventKind = "step_started"
	// EventJudged: a step was judged (Event.Judgment has the figures).
	EventJudged EventKind = "judged"
	// EventCompleted: the new revision holds the whole latest share.
	EventCompleted EventKind = "completed"
	// EventRolledBack: a step failed (or the wake timed out); the previous
	// revision holds the whole latest share again.
	EventRolledBack EventKind = "rolled_back"
	// EventStopped: a person took the route over; the machine no longer
	// touches it.
	EventStopped EventKind = "stopped"
	// EventResumed: a new leader loaded the state and carries on.
	EventResumed EventKind = "resumed"
)

// Event is one thing for people (deploy's lines, status, Nomad scaling
// events) and metrics (nomad_serverless_rollout_*) to hear of.
type Event struct {
	At   time.Time `json:"at"`
	Kind EventKind `json:"kind"`
	// Step is the step's number from 1 (0 before the first), Percent its
	// share of the latest targets' traffic.
	Step    int `json:"step,omitempty"`
	Percent int `json:"percent,omitempty"`
	// Judgment is set for EventJudged.
	Judgment *Judgment `json:"judgment,omitempty"`
	// Message is a sentence for people.
	Message string `json:"message"`
}
