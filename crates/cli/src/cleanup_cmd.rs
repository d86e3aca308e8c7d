//! `agent-sim cleanup`: what a killed Consul run left, removed by name
//! prefix and the run's node meta (see [`agent_sim_consul::cleanup`]).

use agent_sim_consul::cleanup::{CleanupReport, cleanup};

use crate::args::CleanupArgs;
use crate::config;
use crate::plan::{Protocol, UsageError};
use crate::run::exit;

/// Resolves the flags into the Consul settings cleanup needs.
pub fn plan(args: &CleanupArgs) -> Result<agent_sim_consul::ConsulConfig, UsageError> {
    if args.run.targets.is_empty() && args.run.config.is_none() {
        return Err(UsageError(
            "cleanup needs --target (a Consul server's RPC address; the HTTP API is \
             derived from it unless --http-target is given)"
                .into(),
        ));
    }
    let cfg = config::resolve(args.run.clone(), &|k| std::env::var(k).ok())?;
    let mut consul = cfg.fleets.into_iter().filter_map(|f| match f.protocol {
        Protocol::Consul(c) => Some(*c),
        // Sidecars' nodes carry the same prefix and meta: one cleanup.
        Protocol::Dataplane(d) => Some(d.as_consul()),
        Protocol::Sensu(_) => None,
    });
    match (consul.next(), consul.next()) {
        (Some(mut c), None) => {
            // The Vault servers' keys and sessions go too (their path:
            // --vault-path, or the prefix's default).
            if c.vault.is_none() {
                c.vault = Some(Box::new(agent_sim_consul::vault::VaultConfig {
                    path: args.run.vault_path.clone().unwrap_or_default(),
                    ..Default::default()
                }));
            }
            Ok(c)
        }
        (None, _) => Err(UsageError(
            "--kind: cleanup removes what Consul runs left (--kind consul or consul-dataplane)"
                .into(),
        )),
        (Some(_), Some(_)) => Err(UsageError(
            "--config: cleanup takes one Consul fleet at a time".into(),
        )),
    }
}

/// Runs the cleanup and prints what it did; returns the exit code.
pub async fn run(cfg: agent_sim_consul::ConsulConfig, dry_run: bool) -> i32 {
    let api = match agent_sim_consul::http_api(&cfg) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agent-sim: {e}");
            return exit::USAGE;
        }
    };
    match cleanup(&api, &cfg.conn.name_prefix, dry_run).await {
        Ok(r) => {
            print!("{}", render(&r, &cfg.conn.name_prefix, dry_run));
            vault(&cfg, dry_run).await
        }
        Err(e) => {
            eprintln!("agent-sim: cleanup of {:?}: {e}", cfg.conn.name_prefix);
            exit::FAILURE
        }
    }
}

/// Removes what the run's Vault servers left: every key under their path
/// and every session named for it; prints it; the exit code.
async fn vault(cfg: &agent_sim_consul::ConsulConfig, dry_run: bool) -> i32 {
    let Some(v) = &cfg.vault else {
        return exit::OK;
    };
    let prefix = &cfg.conn.name_prefix;
    if let Err(e) = v.validate(prefix) {
        eprintln!("agent-sim: {}: {e}", e.field());
        return exit::USAGE;
    }
    let client = match agent_sim_consul::vault::kv_client(cfg, 4, std::time::Duration::ZERO) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("agent-sim: {e}");
            return exit::USAGE;
        }
    };
    let r = agent_sim_consul::vault::cleanup_path(&client, &v.path, prefix, dry_run).await;
    let path = v.path_for(prefix);
    if dry_run {
        println!(
            "vault {path}: would remove {} key(s) and {} session(s)",
            r.keys_left, r.sessions_left
        );
    } else {
        println!(
            "vault {path}: removed {} key(s) and {} session(s); left {} key(s), {} session(s)",
            r.keys_removed, r.sessions_removed, r.keys_left, r.sessions_left
        );
    }
    match r.error {
        Some(e) => {
            eprintln!("agent-sim: cleanup of {path}: {e}");
            exit::FAILURE
        }
        None if r.keys_left > 0 && !dry_run => exit::FAILURE,
        None => exit::OK,
    }
}

/// The report for people.
pub fn render(r: &CleanupReport, prefix: &str, dry_run: bool) -> String {
    let verb = if dry_run { "would remove" } else { "removed" };
    let mut out = format!(
        "cleanup of {prefix:?}: {verb} {} node(s) with {} session(s), {} config entr{}\n",
        r.nodes.len(),
        r.sessions,
        r.config_entries.len(),
        if r.config_entries.len() == 1 {
            "y"
        } else {
            "ies"
        }
    );
    for e in &r.config_entries {
        out.push_str(&format!("  config entry {e}\n"));
    }
    for k in &r.kv_keys {
        out.push_str(&format!("  kv key {k}\n"));
    }
    if !r.acl_tokens.is_empty() || !r.acl_policies.is_empty() {
        out.push_str(&format!(
            "  {} ACL token(s) and {} ACL polic{} marked as this prefix's\n",
            r.acl_tokens.len(),
            r.acl_policies.len(),
            if r.acl_policies.len() == 1 {
                "y"
            } else {
                "ies"
            }
        ));
    }
    if let Some(w) = &r.acl_unchecked {
        out.push_str(&format!(
            "  ACL tokens not looked for: the token cannot list them ({w}); give --token a \
             management token to remove them\n"
        ));
    }
    for n in r.nodes.iter().take(20) {
        out.push_str(&format!("  node {n}\n"));
    }
    if r.nodes.len() > 20 {
        out.push_str(&format!("  … and {} more nodes\n", r.nodes.len() - 20));
    }
    for l in &r.left_alone {
        out.push_str(&format!(
            "  left alone (not marked as this prefix's): {l}\n"
        ));
    }
    out
}
