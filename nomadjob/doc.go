// Package nomadjob turns a revision into the Nomad job that runs it and talks
// to Nomad for everyone else: deploy, the CLI and the control plane.
//
// Compile is pure: a spec.Revision and Options in, an *api.Job out, built
// exactly to DESIGN.md's "Contract between the parts" with the names in
// spec/contract.go. RevisionFromJob and ScalingFromJob read a job back.
// FormatHCL prints a compiled job as a Nomad jobspec for people.
//
// Client is a thin adapter over the Nomad API client: register with
// optimistic concurrency, scale (it satisfies autoscaler.Scaler), update
// scaling settings in place, list revisions and allocations, stop, purge,
// and follow Nomad's event stream (StreamEvents, once: the caller lists
// again after a break, as a resumed stream may have a gap). Its errors say what
// was being done, to which revision, and what the user can do (see Error).
package nomadjob
