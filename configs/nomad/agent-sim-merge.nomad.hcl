# Merge step for agent-sim.nomad.hcl: one exact report of all shards.
job "agent-sim-merge" {
  type = "batch"

  group "merge" {
    volume "results" {
      type   = "host"
      source = "agent-sim-results"
    }

    task "merge" {
      driver = "docker"

      config {
        image = "registry.example/agent-sim:latest"
        # The image has no shell: a directory stands for its summaries.
        args  = ["report", "merge", "/results", "--summary=/results/merged.json", "--assert=agents.connected == requested"]
      }

      volume_mount {
        volume      = "results"
        destination = "/results"
      }
    }
  }
}
