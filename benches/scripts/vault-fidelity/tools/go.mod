module agentsim/vaultfidelity/tools

go 1.23
