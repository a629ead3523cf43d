// Package certs gives the gateway's HTTPS listener its certificates, from
// three sources in this order of precedence: files given to serve
// (-tls-cert/-tls-key), certificates an operator put in Consul KV by name
// (consulroute.TLSSecretsPrefix), and ACME (RFC 8555) for every other
// name the gateway routes.
//
// ACME goes through certmagic (github.com/caddyserver/certmagic), with its
// storage in Consul KV (Storage) and its locks on Consul sessions
// (consulroute.Mutexes): every replica keeps every routed name managed,
// the first to take a name's lock orders it, and the others find the
// result in storage when they get the lock, so a name is ordered once for
// the cluster and every replica serves the same certificate. Renewal
// starts at a third of the validity left, sooner when the CA's renewal
// information (ARI) says so (Renewal). A failing CA never takes away a
// certificate that is still valid: it stays in use while renewal is
// retried, and the failure shows in Status and in the metrics.
//
// It sits on floor 20 of the house, over consulroute.
package certs
