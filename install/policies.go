package install

import (
	"fmt"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Policy is one ACL policy `install` renders: the least the control plane
// or a `deploy` user needs, as the HCL rules text Nomad and Consul accept.
type Policy struct {
	System      string // "nomad" or "consul"
	Name        string // name to create it under
	File        string // file name when written with -out
	Description string
	Rules       string
}

// Policies returns the four policies, in a fixed order:
//
//   - Nomad, control plane: list and read revision jobs and their
//     allocations (event stream topics Job and Allocation need read-job),
//     read scaling status and set counts, in every namespace (serve streams
//     events with namespace=*). It never registers or stops a job.
//   - the deploy policies are for one namespace, -service-namespace.
//   - Nomad, deploy users: everything `deploy`, `traffic`, `revisions`,
//     `status`, `list`, `logs` and `delete` do: submit-job covers register,
//     deregister and purge; read-logs and read-fs the allocations' logs.
//   - Consul, control plane: register its own service and the stand-in
//     instances of revisions at zero (in revisions' services, so a prefix,
//     on catalog nodes of their own: node write on their prefix),
//     read health on every node, read applied services and hold the leader
//     lock under nomad-serverless/, create the lock's session, and read
//     (the first replica: create) the admin API's keyring and the TLS
//     material (certificates, private keys, the ACME account), each said
//     in a rule of its own so an auditor sees who holds those keys.
//   - Consul, deploy users: write the route's config entries (named after
//     the service and its revisions: service write), the KV copy of the
//     service, and read health while waiting for instances. The control
//     plane's keys are denied outright, not merely left out, so a token
//     that also carries a broader policy (or a Consul whose default policy
//     is allow) still cannot read the admin API's key: deny wins over
//
// The ACL policies install renders, in Nomad and in Consul alike: the
// control plane's (serve) and that of people and CI running deploy,
// traffic, status, logs and delete. Errors of permission name them.
const (
	PolicyControlPlane = "nomad-serverless-control-plane"
	PolicyDeploy       = "nomad-serverless-deploy"
)

// allow at the same prefix.
func Policies(o Options) []Policy {
	ns := o.ServiceNamespace
	return []Policy{
		{
			System:      "nomad",
			Name:        PolicyControlPlane,
			File:        "nomad-control-plane.policy.hcl",
			Description: "nomad-serverless serve: watch revision jobs and set their counts",
			Rules: commentLines(
				"nomad-serverless control plane (serve). Attach it to the install job's workload",
				"identity (nomad acl policy apply -namespace "+o.Namespace+" -job "+o.JobName+" ...) or to a token.",
			) + nomadNamespaceRule("*", []string{"list-jobs", "read-job", "read-job-scaling", "scale-job"},
				"Revision jobs in every namespace: list, read (also the Job and Allocation event",
				"topics, and the allocations' resource use for services scaled on cpu or memory),",
				"read their scaling status and events, and set their counts. serve",
				"follows all namespaces with one event stream (namespace=*), which Nomad allows",
				"only to a policy whose namespace rule is \"*\".",
			),
		},
		{
			System:      "nomad",
			Name:        PolicyDeploy,
			File:        "nomad-deploy.policy.hcl",
			Description: "nomad-serverless deploy, traffic, status, delete",
			Rules: commentLines(
				"Users of nomad-serverless deploy, traffic, revisions, status, list, logs and delete.",
			) + nomadNamespaceRule(ns, []string{"list-jobs", "read-job", "read-job-scaling", "submit-job", "read-logs", "read-fs"},
				"submit-job registers revision jobs and deregisters and purges them on delete;",
				"read-job also reads their allocations while deploy waits for instances;",
				"read-logs streams their logs (logs), read-fs lists the log files (logs -since).",
			) + nomadNodeRule("read",
				"deploy reads the nodes' docker versions: where every one announces a",
				"container's address (docker 28 or later), the queue-proxy starts beside a",
				"docker app instead of after it, and wakes are faster.",
			),
		},
		{
			System:      "consul",
			Name:        PolicyControlPlane,
			File:        "consul-control-plane.policy.hcl",
			Description: "nomad-serverless serve: instances, routes, activator registrations, leader lock",
			Rules: commentLines(
				"nomad-serverless control plane (serve).",
			) + consulRule("service_prefix", "", "write",
				"Reads every revision's instances and route config entries; registers",
				spec.ActivatorServiceName+" (and "+spec.InternalServiceName+" for its internal listener)",
				"and, while a revision is at zero, one stand-in",
				"instance in that revision's service (named <service>-<generation>, so a prefix).",
				"The leader removes, through the agent that holds them, the",
				"activator registration of a replica that died (its session ended).",
			) + consulRule("node_prefix", "", "read",
				"Health queries list instances on every node.",
			) + consulRule("node_prefix", consulroute.StandInNodePrefix, "write",
				"The stand-ins are catalog registrations on nodes of their own, without an",
				"agent (16 per replica, named "+consulroute.StandInNodePrefix+"<replica>-NN): each",
				"replica registers its own there, and the leader removes a dead replica's.",
			) + consulRule("key_prefix", "nomad-serverless/", "write",
				"Applied services (read) and the leader lock (write).",
			) + consulRule("key", consulroute.AdminKeysKey, "write",
				"The admin API's keyring: replicas sign their writes to each other's admin",
				"API with it (the first replica creates it, with check-and-set). Only the",
				"control plane may read it.",
			) + consulRule("key_prefix", consulroute.TLSKVPrefix, "write",
				"The gateway's TLS material: the ACME account key, the certificates it obtained",
				"with their private keys, the operator's certificates by name (read from",
				consulroute.TLSSecretsPrefix+"), and the locks that make one replica order",
				"a name. Only the control plane may read it.",
			) + consulRule("session_prefix", "", "write",
				"The leader lock's session and the certificate locks' session, created on the",
				"node of the replica's Consul agent; the leader lists every session to tell",
				"which replicas are alive.",
			),
		},
		{
			System:      "consul",
			Name:        PolicyDeploy,
			File:        "consul-deploy.policy.hcl",
			Description: "nomad-serverless deploy, traffic, status, delete",
			Rules: commentLines(
				"Users of nomad-serverless deploy, traffic, revisions, status, list and delete.",
			) + consulRule("service_prefix", "", "write",
				"service-defaults, service-splitter, service-router and service-resolver",
				"entries are named after the service and its revisions.",
			) + consulRule("node_prefix", "", "read",
				"deploy reads instances' health while it waits for them.",
			) + consulRule("key_prefix", "nomad-serverless/services/", "write",
				"The last applied copy of each service.",
			) + consulRule("key", consulroute.TracingKey, "read",
				"serve's tracing settings (OTEL_*), compiled into each new revision's sidecar.",
			) + consulRule("key_prefix", consulroute.ControlPlaneKVPrefix, "deny",
				"The control plane's own keys, the admin API's keyring among them: whoever",
				"reads it can scale every revision through the admin API. The gateway's TLS",
				"private keys are there too ("+consulroute.TLSKVPrefix+").",
			),
		},
	}
}

func commentLines(comment ...string) string {
	var b strings.Builder
	for _, c := range comment {
		b.WriteString("# " + c + "\n")
	}
	return b.String()
}

func nomadNamespaceRule(ns string, caps []string, comment ...string) string {
	var b strings.Builder
	b.WriteString("\n")
	b.WriteString(commentLines(comment...))
	fmt.Fprintf(&b, "namespace %q {\n", ns)
	quoted := make([]string, len(caps))
	for i, c := range caps {
		quoted[i] = fmt.Sprintf("%q", c)
	}
	fmt.Fprintf(&b, "  capabilities = [%s]\n}\n", strings.Join(quoted, ", "))
	return b.String()
}

func nomadNodeRule(policy string, comment ...string) string {
	return fmt.Sprintf("\n%snode {\n  policy = %q\n}\n", commentLines(comment...), policy)
}

func consulRule(kind, prefix, policy string, comment ...string) string {
	return fmt.Sprintf("\n%s%s %q {\n  policy = %q\n}\n", commentLines(comment...), kind, prefix, policy)
}
