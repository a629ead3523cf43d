// Package controlplane is what `nomad-serverless serve` runs on every
// replica: the gateway and activator on one listener, the admin API
// (health, metrics, autoscaler state, writes signed between replicas) on
// another, the catalog kept in step with Nomad's events and Consul's
// health (feed.go), the activator's registration in Consul kept
// (register.go), the stand-in instances of revisions at zero kept
// (standins.go), and, on the replica that holds the Consul lock, the
// autoscaler.
//
// Run is the one entry point; the command parses flags, builds the Nomad
// and Consul clients and the logger, and calls it. The parts it wires
// live below it (catalog, activator, autoscaler, nomadjob, consulroute);
// only the command imports this package.
package controlplane
