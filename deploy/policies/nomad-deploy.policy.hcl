# Users of nomad-serverless deploy, traffic, revisions, status, list, logs and delete.

# submit-job registers revision jobs and deregisters and purges them on delete;
# read-job also reads their allocations while deploy waits for instances;
# read-logs streams their logs (logs), read-fs lists the log files (logs -since).
namespace "default" {
  capabilities = ["list-jobs", "read-job", "read-job-scaling", "submit-job", "read-logs", "read-fs"]
}
