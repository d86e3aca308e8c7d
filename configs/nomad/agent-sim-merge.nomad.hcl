# Merge step for agent-sim.nomad.hcl: one exact report of all shards,
# written beside them (a merge run again does not read its own output).
# The task fails (exit 3) if an assertion fails.
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
        args  = ["report", "merge", "/results", "--summary=/results/merged.json", "--assert=agents.connected == requested", "--assert=errors.total == 0"]
      }

      volume_mount {
        volume      = "results"
        destination = "/results"
      }
    }
  }
}
