# Merge step for agent-sim.nomad.hcl: one exact report of all shards.
job "agent-sim-merge" {
  type = "batch"

  group "merge" {
    volume "results" {
      type   = "host"
      source = "agent-sim-results"
    }

    task "merge" {
      driver = "raw_exec"

      config {
        command = "/bin/sh"
        args = ["-c", "agent-sim report merge /results/summary-*.json --summary /results/merged.json --assert 'agents.connected == requested'"]
      }

      volume_mount {
        volume      = "results"
        destination = "/results"
      }
    }
  }
}
