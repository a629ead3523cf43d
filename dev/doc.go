// Package dev is what `nomad-serverless dev` does on a developer's machine:
// start local Consul and Nomad dev agents (dev/devagents; with Nodes, a
// cluster of client nodes on loopback addresses) and the control plane,
// print where everything is, optionally deploy a file and show its wake
// from zero, and stop everything in order on Ctrl-C; or, without the
// agents, run the demonstration over dev/localcluster (RunDemo). It
// narrates on the writers it is given; the command parses the flags and
// passes in how to run `deploy` and read Nomad. Only the command imports
// it.
package dev
