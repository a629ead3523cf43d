# Users of nomad-serverless deploy, traffic, revisions, status, list, logs and delete.

# submit-job registers revision jobs and deregisters and purges them on delete;
# read-job also reads their allocations while deploy waits for instances;
# read-logs streams their logs (logs), read-fs lists the log files (logs -since).
namespace "default" {
  capabilities = ["list-jobs", "read-job", "read-job-scaling", "submit-job", "read-logs", "read-fs"]
}

# deploy reads the nodes' docker versions: where every one announces a
# container's address (docker 28 or later), the queue-proxy starts beside a
# docker app instead of after it, and wakes are faster.
node {
  policy = "read"
}
