# N shards of agent-sim as a Nomad batch job. Each allocation reads its shard
# index from NOMAD_ALLOC_INDEX (`--shard 4` = 4 shards) and writes its results
# to a host volume shared by the group; run the merge job afterwards:
#   nomad job run agent-sim.nomad.hcl
#   nomad job run agent-sim-merge.nomad.hcl
job "agent-sim" {
  type = "batch"

  group "shards" {
    count = 4  # = number of shards; keep in sync with --shard below

    # One shard per client node: fds and ephemeral ports are per host.
    constraint {
      operator = "distinct_hosts"
      value    = "true"
    }

    restart {
      attempts = 0
      mode     = "fail"
    }

    volume "results" {
      type   = "host"
      source = "agent-sim-results"
    }

    task "agent-sim" {
      # The image built from the repository's Dockerfile, or with no registry
      # by scripts/image.sh (docs/running.md#container-image), pushed where
      # the clients pull from.
      driver = "docker"

      config {
        image = "registry.example/agent-sim:latest"
        # Host networking: the fleet's sockets are the host's (fds and
        # ephemeral ports are per host, as the constraint above assumes).
        network_mode = "host"
        ulimit {
          nofile = "65536:65536"
        }
        args = [
          "--agents=40000",
          "--shard=4",
          "--target=sensu-backend.service.consul:8081",
          "--keepalive-interval=60s",
          "--ramp=200/s",
          "--duration=30m",
          "--summary=/results/summary-${NOMAD_ALLOC_INDEX}.json",
          "--hlog=/results/run-${NOMAD_ALLOC_INDEX}.hlog",
          "--quiet",
        ]
      }

      volume_mount {
        volume      = "results"
        destination = "/results"
      }

      resources {
        cpu    = 2000
        memory = 2048
      }
    }
  }
}
