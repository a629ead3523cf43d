# Users of nomad-serverless deploy, traffic, revisions, status, list and delete.

# submit-job registers revision jobs and deregisters and purges them on delete;
# read-job also reads their allocations while deploy waits for instances.
namespace "default" {
  capabilities = ["list-jobs", "read-job", "read-job-scaling", "submit-job"]
}
