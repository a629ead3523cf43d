// Package install builds what `nomad-serverless install` puts on a cluster:
// the Nomad job that runs the control plane (`serve`, replicas spread over
// nodes behind the Consul service nomad-serverless-gateway) and the least
// Nomad and Consul ACL policies for it and for deploy users, rendered as
// API JSON or a jobspec and written as files. It talks to no cluster: the
// command registers the job.
package install
