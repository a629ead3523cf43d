# nomad-serverless control plane (serve). Attach it to the install job's workload
# identity (nomad acl policy apply -namespace default -job nomad-serverless ...) or to a token.

# Revision jobs in every namespace: list, read (also the Job and Allocation event
# topics, and the allocations' resource use for services scaled on cpu or memory),
# read their scaling status and events, and set their counts. serve
# follows all namespaces with one event stream (namespace=*), which Nomad allows
# only to a policy whose namespace rule is "*".
namespace "*" {
  capabilities = ["list-jobs", "read-job", "read-job-scaling", "scale-job"]
}
