# nomad-serverless control plane (serve).

# Reads every revision's instances and route config entries; registers
# nomad-serverless-activator (and nomad-serverless-internal for its internal listener)
# and, while a revision is at zero, one stand-in
# instance in that revision's service (named <service>-<generation>, so a prefix).
# The leader removes, through the agent that holds them, the
# activator registration of a replica that died (its session ended).
service_prefix "" {
  policy = "write"
}

# Health queries list instances on every node.
node_prefix "" {
  policy = "read"
}

# The stand-ins are catalog registrations on nodes of their own, without an
# agent (16 per replica, named nomad-serverless-stand-ins-<replica>-NN): each
# replica registers its own there, and the leader removes a dead replica's.
node_prefix "nomad-serverless-stand-ins-" {
  policy = "write"
}

# Applied services (read) and the leader lock (write).
key_prefix "nomad-serverless/" {
  policy = "write"
}

# The admin API's keyring: replicas sign their writes to each other's admin
# API with it (the first replica creates it, with check-and-set). Only the
# control plane may read it.
key "nomad-serverless/control-plane/admin-keys" {
  policy = "write"
}

# The gateway's TLS material: the ACME account key, the certificates it obtained
# with their private keys, the operator's certificates by name (read from
# nomad-serverless/control-plane/tls/secrets/), and the locks that make one replica order
# a name. Only the control plane may read it.
key_prefix "nomad-serverless/control-plane/tls/" {
  policy = "write"
}

# The leader lock's session and the certificate locks' session, created on the
# node of the replica's Consul agent; the leader lists every session to tell
# which replicas are alive.
session_prefix "" {
  policy = "write"
}
