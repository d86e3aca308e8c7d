//! Command-line flags (clap). Every run flag is optional here so that the
//! layering defaults < `--config FILE` < `AGENT_SIM_*` env < flags can be
//! resolved in [`crate::config`]; clap itself applies env < flags.

use std::net::SocketAddr;
use std::path::PathBuf;

use agent_sim_consul::ProbeKinds;
use agent_sim_fleet::Rate;
use agent_sim_fleet::ReconnectPolicy;
use agent_sim_fleet::scenario::{ChurnSpec, PauseSpec, RampDownSpec, StormSpec};
use agent_sim_metrics::assert::Assertion;
use agent_sim_observe::ObserveSpec;
use agent_sim_sensu::Encoding;
use clap::{Args, Parser, Subcommand};

use crate::values::{AddrRange, Kind, List, Ramp, Secs, ServerDown, ShardSpec, Toggle};

mod serve;
pub use serve::ServeArgs;

/// The `--help` headings of the flag groups, each naming the docs page
/// that explains them.
pub mod heading {
    /// Sensu agents.
    pub const SENSU: &str = "Sensu (docs/sensu.md)";
    /// TLS to Sensu and Consul targets.
    pub const TLS: &str = "TLS (docs/consul.md#tls, docs/sensu.md#tls)";
    /// Consul client agents.
    pub const CONSUL: &str = "Consul (docs/consul.md)";
    /// Consul dataplane sidecars.
    pub const DATAPLANE: &str = "Consul dataplane (docs/dataplane.md)";
    /// Churn, storms, pauses, reconnect policies.
    pub const SCENARIOS: &str = "Scenarios (docs/scenarios.md)";
    /// Several servers, one of them lost and back.
    pub const FAILOVER: &str = "Failover (docs/failover.md)";
    /// Summary, hlog, Prometheus, assertions, the report page.
    pub const RESULTS: &str = "Results (docs/results.md)";
    /// Several processes and boxes.
    pub const MULTI_BOX: &str = "Several processes (docs/multi-box.md)";
    /// `serve --faults`.
    pub const FAULTS: &str = "Faults (docs/faults.md)";
    /// Observing the servers under load.
    pub const OBSERVE: &str = "Watching the server (docs/observe.md)";
    /// Stepped runs to the knee.
    pub const CAPACITY: &str = "Finding the capacity (docs/capacity.md)";
}

/// Simulate tens of thousands of Sensu Go or Consul agents from one process.
#[derive(Debug, Parser)]
#[command(
    name = "agent-sim",
    version,
    about,
    args_conflicts_with_subcommands = true,
    after_help = "Exit codes: 0 complete, 1 nothing could run, 2 incomplete fleet, 3 an --assert failed, 64 bad usage.\n\
                  Without --target the embedded reference backend runs in-process (demo mode).\n\
                  Guide: README.md, then docs/ (one page per job; each heading above names its page)."
)]
pub struct Cli {
    /// Subcommand; without one, agent-sim runs a fleet.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Flags of a fleet run.
    #[command(flatten)]
    pub run: RunArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the embedded reference backend (Sensu and/or Consul) until Ctrl-C.
    #[command(after_help = agent_sim_server::faults::HELP)]
    Serve(Box<ServeArgs>),
    /// Show or merge result files.
    #[command(subcommand)]
    Report(ReportCommand),
    /// Remove what a killed Consul run left: its nodes (services, checks,
    /// sessions) and probe objects, selected by --name-prefix and the node
    /// meta agent-sim-prefix every run sets, and its Vault servers' keys
    /// (under --vault-path) and lock sessions. Takes the run's flags
    /// (--kind consul, --target, --http-target, --token, TLS, --config).
    Cleanup(Box<CleanupArgs>),
    /// Check whether this host can hold a run, before running it: file
    /// descriptors, ephemeral ports per source address and target,
    /// somaxconn, conntrack and memory, with the exact fix for each problem.
    /// Takes the run's flags (--agents, --kind, --target, --source-addr,
    /// --shard, --config). Exit 0: fits; 2: does not fit; 64: bad usage.
    Doctor(Box<DoctorArgs>),
    /// Run a published experiment as one command (docs/studies/): its
    /// fleet, topology and probes, against the embedded backend or real
    /// servers with --target; the table and the page end with the published
    /// figures beside the run's. `--list` names them.
    Study(Box<StudyArgs>),
}

/// `agent-sim study NAME ...`
#[derive(Debug, Args)]
pub struct StudyArgs {
    /// The study (consul-global-scale, sensu-scaling, criteo-streaming,
    /// vault-outage, auth-cost).
    #[arg(value_name = "NAME", required_unless_present = "list")]
    pub name: Option<String>,
    /// List the studies, their default scale and page, and exit.
    #[arg(long)]
    pub list: bool,
    /// The fleet and topology as a share of the published ones (0 < F <= 1;
    /// default: the study's own, small enough for one laptop); durations
    /// the study names shrink with it, so rates stay the published ones.
    #[arg(long, value_name = "F")]
    pub scale: Option<f64>,
    /// The run's flags: they beat the study's settings (e.g. --target,
    /// --http-target, --observe, --summary, --report-html).
    #[command(flatten)]
    pub run: RunArgs,
}

/// `agent-sim doctor ...`
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Read the host's limits from this /proc tree (e.g. the host's /proc
    /// mounted into a container).
    #[arg(long, value_name = "DIR", default_value = "/proc")]
    pub proc_root: PathBuf,
    /// The run's flags.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `agent-sim cleanup ...`
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// List what would be removed, remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The run's flags (only the Consul target, token, TLS and name prefix
    /// are used).
    #[command(flatten)]
    pub run: RunArgs,
}

/// `agent-sim report ...`
#[derive(Debug, Subcommand)]
pub enum ReportCommand {
    /// Render one summary JSON (or hlog) as the human table.
    Show {
        /// A summary JSON written by --summary, or an hlog written by --hlog.
        file: PathBuf,
        /// List every counter with its total and average rate.
        #[arg(long, short = 'v')]
        verbose: bool,
    },
    /// Write the report page: one self-contained HTML file with the run's
    /// charts, from a summary (and its hlogs); several summaries are merged.
    Html {
        /// Summary JSON files and/or hlog files; a directory stands for the
        /// summaries (*.json) in it.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Where to write the page.
        #[arg(long, short = 'o', value_name = "PATH")]
        out: PathBuf,
        /// SLO assertions to judge on the page (default: the run's own,
        /// from the summary's config).
        #[arg(long = "assert", value_name = "EXPR")]
        asserts: Vec<Assertion>,
    },
    /// Merge summaries and/or hlogs of several processes into one exact report.
    Merge {
        /// Summary JSON files and/or hlog files; a directory stands for the
        /// summaries (*.json) in it.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Write the merged report as summary JSON here.
        #[arg(long, value_name = "PATH")]
        summary: Option<PathBuf>,
        /// SLO assertions evaluated on the merged report (docs/results.md).
        #[arg(long = "assert", value_name = "EXPR")]
        asserts: Vec<Assertion>,
    },
    /// Two runs side by side, client and server figures, with the ratio
    /// B/A (a server upgrade, a config change, streaming vs blocking). A
    /// directory stands for the summaries in it, merged.
    Compare {
        /// Run A: a summary JSON, or a directory of shard summaries.
        a: PathBuf,
        /// Run B: likewise.
        b: PathBuf,
        /// Also write the comparison as a page here.
        #[arg(long, short = 'o', value_name = "PATH")]
        out: Option<PathBuf>,
        /// How far B may move from A on a figure, e.g. 'propagation.p99
        /// +10%' or 'capacity.agents -0%' (repeatable); exit 3 if one fails.
        #[arg(long = "threshold", value_name = "EXPR")]
        thresholds: Vec<agent_sim_metrics::gate::Threshold>,
    },
}

/// Flags of a fleet run (`agent-sim [FLAGS]`). The same struct reads the
/// `--config` TOML file (keys are the flag names, kebab-case) and each of its
/// `[[fleet]]` sections. Every value is typed (see [`crate::values`]) and
/// parsed once where it enters; `None` means "not set in this layer", so a
/// later layer can set it (boolean flags too: `--deregister=false`).
/// Defaults are filled in by [`crate::defaults::defaults`] and shown by
/// `--help` from there.
#[derive(Debug, Args, Default, Clone, serde::Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct RunArgs {
    /// TOML file with the same keys as the flags (kebab-case); flags win.
    #[arg(long, value_name = "FILE", env = "AGENT_SIM_CONFIG")]
    pub config: Option<PathBuf>,
    /// Agent protocol: sensu, consul or consul-dataplane.
    #[arg(long, value_name = "KIND", env = "AGENT_SIM_KIND")]
    pub kind: Option<Kind>,
    /// Number of agents (across all shards).
    #[arg(long, short = 'n', env = "AGENT_SIM_AGENTS")]
    pub agents: Option<u64>,
    /// Backend address (repeatable; agents are spread over them). Sensu:
    /// host:port or ws(s)://host:port/; Consul: the server RPC port host:port.
    /// Omit to run against the embedded reference backend in-process.
    #[serde(rename = "target", alias = "targets")]
    #[arg(
        long = "target",
        short = 't',
        value_name = "ADDR",
        env = "AGENT_SIM_TARGET",
        value_delimiter = ','
    )]
    pub targets: Vec<String>,
    /// How long to run (e.g. 60s, 10m); default: until Ctrl-C.
    #[arg(long, short = 'd', value_name = "DURATION", env = "AGENT_SIM_DURATION")]
    pub duration: Option<Secs>,
    /// Agents started per second (e.g. 500/s), or `all` to start at once.
    #[arg(long, value_name = "RATE", env = "AGENT_SIM_RAMP")]
    pub ramp: Option<Ramp>,
    /// Start each agent at a uniform random moment of this window instead of
    /// on --ramp, as large fleets boot (HashiCorp's 10,000-node benchmark
    /// started each agent after a random 1-1,560 s).
    #[arg(long, value_name = "DURATION")]
    pub boot_window: Option<Secs>,
    /// Most connection handshakes in flight at once.
    #[arg(long, value_name = "N", env = "AGENT_SIM_MAX_DIALING")]
    pub max_dialing: Option<usize>,
    /// Smallest reconnect delay (growing to --reconnect-max as --reconnect says).
    #[arg(long, value_name = "DURATION")]
    pub reconnect_min: Option<Secs>,
    /// Largest reconnect delay.
    #[arg(long, value_name = "DURATION")]
    pub reconnect_max: Option<Secs>,
    /// Time sessions get to close on shutdown before the report is written.
    #[arg(long, value_name = "DURATION")]
    pub shutdown_grace: Option<Secs>,
    /// Source address to dial from (repeatable, or a range 127.0.0.2-127.0.0.9).
    #[serde(rename = "source-addr", alias = "source-addrs")]
    #[arg(long = "source-addr", value_name = "IP", value_delimiter = ',')]
    pub source_addrs: Vec<AddrRange>,
    /// Prefix of agent names: `<prefix>-<index>`.
    #[arg(long, value_name = "PREFIX", env = "AGENT_SIM_NAME_PREFIX")]
    pub name_prefix: Option<String>,
    /// Tokio worker threads (default: number of cores).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Stop the run (exit 1) at the first failure that cannot heal by itself:
    /// bad credentials, unknown namespace, ACL denied, wrong protocol on the port.
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub fail_fast: Option<bool>,
    /// When no agent ever connected, stop (exit 1) once every agent has failed
    /// twice with a cause that cannot heal by itself over at least this long.
    #[arg(long, value_name = "DURATION")]
    pub give_up_after: Option<Secs>,

    // --- Sensu ---
    /// Sensu: keepalive interval.
    #[arg(long, value_name = "DURATION", help_heading = heading::SENSU)]
    pub keepalive_interval: Option<Secs>,
    /// Sensu: step of the agents' shared timer grid: the keepalives and pings
    /// due within one step go out in one wakeup; each agent's schedule starts
    /// on a step, its intervals unchanged (0 = each timer at its own instant).
    #[arg(long, value_name = "DURATION", help_heading = heading::SENSU)]
    pub timer_tick: Option<Secs>,
    /// Sensu: keepalive warning timeout in seconds (check.timeout).
    #[arg(long, value_name = "SECS", help_heading = heading::SENSU)]
    pub keepalive_warning_timeout: Option<u32>,
    /// Sensu: keepalive critical timeout in seconds (check.ttl, 0 = off).
    #[arg(long, value_name = "SECS", help_heading = heading::SENSU)]
    pub keepalive_critical_timeout: Option<u32>,
    /// Sensu: namespace.
    #[arg(long, help_heading = heading::SENSU, env = "AGENT_SIM_SENSU_NAMESPACE")]
    pub namespace: Option<String>,
    /// Sensu: agent user.
    #[arg(long, help_heading = heading::SENSU, env = "AGENT_SIM_SENSU_USER")]
    pub user: Option<String>,
    /// Sensu: agent password.
    #[arg(
        long,
        help_heading = heading::SENSU,
        env = "AGENT_SIM_SENSU_PASSWORD",
        hide_env_values = true
    )]
    pub password: Option<String>,
    /// Sensu: subscriptions (comma-separated).
    #[arg(long, value_name = "LIST", help_heading = heading::SENSU)]
    pub subscriptions: Option<List>,
    /// Sensu: wire encoding, protobuf or json.
    #[arg(long, value_name = "ENC", help_heading = heading::SENSU)]
    pub encoding: Option<Encoding>,
    /// Sensu: ask the backend to delete entities when keepalives stop.
    #[arg(long, help_heading = heading::SENSU, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub deregister: Option<bool>,
    /// Sensu: agent-side events per agent (e.g. 0.2/s), besides check replies.
    #[arg(long, value_name = "RATE", help_heading = heading::SENSU)]
    pub event_rate: Option<Rate>,
    /// Sensu: bytes of output in each agent-side event.
    #[arg(long, value_name = "BYTES", help_heading = heading::SENSU)]
    pub event_output_size: Option<usize>,
    /// Sensu/Consul: PEM file of CA certificates for TLS targets.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub ca_file: Option<PathBuf>,
    /// Sensu/Consul: do not verify the server certificate (lab use only).
    #[arg(long, help_heading = heading::TLS, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub insecure_skip_tls_verify: Option<bool>,
    /// Sensu/Consul: PEM client certificate (Consul servers with
    /// verify_incoming require one); with --key-file.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub cert_file: Option<PathBuf>,
    /// Sensu/Consul: PEM private key of --cert-file.
    #[arg(long, value_name = "FILE", help_heading = heading::TLS)]
    pub key_file: Option<PathBuf>,
    /// Consul: name to verify in the servers' certificates (e.g.
    /// server.dc1.consul); default the target's host. Implies TLS.
    #[arg(long, value_name = "NAME", help_heading = heading::TLS)]
    pub tls_server_name: Option<String>,

    // --- Consul ---
    /// Consul: HTTP API address (default: the first target's host, port 8500).
    #[arg(long, value_name = "ADDR", help_heading = heading::CONSUL)]
    pub http_target: Option<String>,
    /// Consul: ACL token.
    #[arg(
        long,
        help_heading = heading::CONSUL,
        env = "CONSUL_HTTP_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Consul: each agent's own ACL token: node-identity (one created per agent
    /// with --token, deleted at the end) or FILE (one secret per line, line i for agent i).
    #[arg(long, value_name = "node-identity|FILE", help_heading = heading::CONSUL)]
    pub acl_tokens: Option<agent_sim_consul::acl::TokenSource>,
    /// Consul: token creates per second with --acl-tokens node-identity
    /// (each is a raft write).
    #[arg(long, value_name = "RATE", help_heading = heading::CONSUL)]
    pub acl_token_rate: Option<Rate>,
    /// Consul: upstream services each agent subscribes to (comma-separated;
    /// `{i}` or `{i%N}` expand per agent, e.g. svc-{i%100}; '' watches
    /// nothing, as most client agents).
    #[arg(long, value_name = "LIST", help_heading = heading::CONSUL)]
    pub upstreams: Option<List>,
    /// Consul: service instances each agent registers.
    #[arg(long, value_name = "N", help_heading = heading::CONSUL)]
    pub services_per_agent: Option<u32>,
    /// Consul: name of the agents' own service.
    #[arg(long, value_name = "NAME", help_heading = heading::CONSUL)]
    pub service_name: Option<String>,
    /// Consul: chains of services, each tier calling the next (instances
    /// per tier, e.g. 10,83,85): each agent registers about
    /// --services-per-agent instances of its tier's NAME-{a,b,..}-{chain}
    /// and watches the next tier of its chain (docs/consul.md).
    #[arg(long, value_name = "N,N,..", help_heading = heading::CONSUL)]
    pub service_chain: Option<agent_sim_consul::chain::ChainSpec>,
    /// Consul: register a connect-proxy sidecar per instance.
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub sidecars: Option<bool>,
    /// Consul: do not register nodes and services in the catalog.
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub no_register: Option<bool>,
    /// Consul: leave registrations in place on shutdown.
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub keep_registrations: Option<bool>,
    /// Consul: TTL of each agent's keepalive session (renewed every TTL/2), or `off`.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub session_ttl: Option<Toggle<Secs>>,
    /// Consul: anti-entropy interval (Consul's ae_interval, scaled up with
    /// the cluster size and jittered), or `off`: each agent checks the
    /// catalog's view of its node and registers again what was lost.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub anti_entropy: Option<Toggle<Secs>>,
    /// Consul: per-agent check status flaps (e.g. 0.01/s).
    #[arg(long, value_name = "RATE", help_heading = heading::CONSUL)]
    pub flap_rate: Option<Rate>,
    /// Consul: propagation probe kind: catalog, intentions, kv (the run's
    /// key <name-prefix>/probe/kv, timed to every KV watcher), off, or
    /// catalog,intentions (both, the intentions change half an interval
    /// after each catalog change, timed as propagation_intentions).
    #[arg(long, value_name = "KIND", help_heading = heading::CONSUL)]
    pub probe: Option<Toggle<ProbeKinds>>,
    /// Consul: interval between propagation probes.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub probe_every: Option<Secs>,
    /// Consul: deliveries later than this after T0 count as missing
    /// (default: 10s, or --probe-every when shorter).
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub probe_timeout: Option<Secs>,
    /// Consul: the service the probe changes (default: the run's own
    /// `<name-prefix>-probe`, which every agent also watches; an existing
    /// intentions entry it did not create is never touched).
    #[arg(long, value_name = "NAME", help_heading = heading::CONSUL)]
    pub probe_service: Option<String>,

    /// Consul: what agents write their catalog and sessions with: client
    /// (a Consul 1.20 client agent's own RPCs on the server RPC port:
    /// anti-entropy, sessions, coordinates) or api (the HTTP API, as
    /// consul-esm or a catalog sync) [default: client; api with --watch
    /// http].
    #[arg(long, value_name = "WIRE", help_heading = heading::CONSUL)]
    pub consul_agent: Option<agent_sim_consul::modes::AgentWire>,
    /// Consul: each client agent is a member of the LAN gossip pool (serf
    /// and memberlist, as a real one: probes, push-pulls, leave)
    /// [default: true with --consul-agent client].
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub gossip: Option<bool>,
    /// Consul: the servers' serf LAN addresses to join (repeatable)
    /// [default: each target host, port 8301].
    #[arg(long = "gossip-join", value_name = "HOST:PORT", value_delimiter = ',', help_heading = heading::CONSUL)]
    pub gossip_join: Vec<String>,
    /// Consul: where the members listen, UDP and TCP (repeatable; IP or
    /// IP:PORT) [default: the local address toward the first server].
    #[arg(long = "gossip-bind", value_name = "IP[:PORT]", value_delimiter = ',', help_heading = heading::CONSUL)]
    pub gossip_bind: Vec<String>,
    /// Consul: the cluster's gossip encryption key (`encrypt`, base64 as
    /// `consul keygen` prints it); several, comma-separated, primary first.
    #[arg(long, value_name = "KEY", env = "CONSUL_GOSSIP_KEY", hide_env_values = true, help_heading = heading::CONSUL)]
    pub gossip_key: Option<String>,
    /// Consul: the cluster's gossip label.
    #[arg(long, value_name = "LABEL", help_heading = heading::CONSUL)]
    pub gossip_label: Option<String>,
    /// Consul: agents with --sidecars keep a Connect leaf certificate (client
    /// wire), as a 1.20 agent does; `false` leaves ConnectCA alone.
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub leaf_certs: Option<bool>,
    /// Consul: at this time from the first dial, change the CA configuration
    /// so that the servers make a new root; the run times every agent to a
    /// certificate of it (embedded backend, or --allow-ca-rotation).
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub rotate_ca_at: Option<Secs>,
    /// Consul: allow --rotate-ca-at against a real cluster (its CA changes).
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub allow_ca_rotation: Option<bool>,
    /// Consul: each client agent first asks the servers for its own TLS
    /// certificate (auto_encrypt: AutoEncrypt.Sign on each server in turn,
    /// backing off as a 1.20 agent), timed as latency auto_encrypt.
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub auto_encrypt: Option<bool>,
    /// Consul: how each upstream is watched: streaming (Subscribe on the
    /// RPC port), blocking (Health.ServiceNodes blocking queries on the RPC
    /// port, as agents with streaming off) or http (long polls of
    /// /v1/health/service, as consul-template).
    #[arg(long, value_name = "MODE", help_heading = heading::CONSUL)]
    pub watch: Option<agent_sim_consul::watch::WatchMode>,
    /// Consul: longest a blocking query or long poll is held when nothing
    /// changes (Consul adds up to 1/16 of jitter; 1s to 10m).
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub blocking_wait: Option<Secs>,

    /// Consul: a service of COUNT instances the run registers before its
    /// agents start and removes after them (NAME=COUNT, e.g. big=5000;
    /// name it in --upstreams to watch it).
    #[arg(long, value_name = "NAME=COUNT", help_heading = heading::CONSUL)]
    pub seed_service: Option<agent_sim_consul::seed::SeedService>,
    /// Consul: every DURATION, set new metadata on the probe's own instance
    /// (it stays registered) and time its arrival at every watcher: the
    /// catalog probe, as a change of one instance of --probe-service.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub change_every: Option<Secs>,
    /// Consul: a KV prefix every agent watches as consul-template does
    /// (repeatable; `{i}` or `{i%N}` for one per agent): blocking recursive
    /// reads at the last index, KVS.List on the client wire, GET
    /// /v1/kv/PREFIX?recurse on the HTTP one [default with --probe kv:
    /// <name-prefix>/].
    #[arg(long = "watch-kv", value_name = "PREFIX", help_heading = heading::CONSUL)]
    pub watch_kv: Vec<String>,
    /// Consul: Connect proxies behind each agent, each watching all its
    /// upstreams through the agent's own subscriptions; the probe is also
    /// timed at each proxy's xDS hand-off (propagation_proxy); 0 = none.
    #[arg(long, value_name = "N", help_heading = heading::CONSUL)]
    pub proxies_per_agent: Option<u32>,
    /// Consul: proxycfg's coalescing window: an update reaches a proxy this
    /// long after the one that started its send, at the earliest.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub proxy_coalesce: Option<Secs>,
    /// Consul: each agent's proxy update limiter, shared by its proxies
    /// (Consul's xds.update_max_per_second, burst 1).
    #[arg(long, value_name = "RATE", help_heading = heading::CONSUL)]
    pub proxy_update_rate: Option<Rate>,

    // --- Vault on Consul (docs/writes.md#vaults-storage) ---
    /// Consul: simulated Vault servers storing in the cluster as Vault's
    /// `storage "consul"` does (the HA lock, token writes); 0 = none.
    #[arg(long, value_name = "N", help_heading = heading::CONSUL)]
    pub vault_nodes: Option<u32>,
    /// Consul: Vault token creates on the active node, steady (e.g. 200/s).
    #[arg(long, value_name = "RATE", help_heading = heading::CONSUL)]
    pub vault_tokens: Option<Rate>,
    /// Consul: a Vault token's life: renewed at half, revoked at its end.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub vault_token_ttl: Option<Secs>,
    /// Consul: each Vault token renewed once at half its TTL (a client
    /// keeping its token, as Nomad's allocations do); false: tokens are
    /// created and expire [default: true].
    #[arg(long, help_heading = heading::CONSUL, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub vault_renew: Option<bool>,
    /// Consul: a Vault token storm (repeatable): at=T,tokens=N creates at
    /// once through Vault's max_parallel pool.
    #[serde(
        rename = "vault-burst",
        alias = "vault-bursts",
        deserialize_with = "crate::values::one_or_many"
    )]
    #[arg(long = "vault-burst", value_name = "at=T,tokens=N", help_heading = heading::CONSUL)]
    pub vault_bursts: Vec<agent_sim_consul::vault::Burst>,
    /// Consul: Vault's storage path [default: <name-prefix>/vault/].
    #[arg(long, value_name = "PATH", help_heading = heading::CONSUL)]
    pub vault_path: Option<String>,
    /// Consul: the active Vault server steps down and stops at this time
    /// (an upgrade's restart): the lock's handover is measured.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub vault_stop_active_at: Option<Secs>,
    /// Consul: the active Vault server dies at this time (no release, its
    /// session left to expire): the handover waits for the session's TTL
    /// and the server's lock-delay.
    #[arg(long, value_name = "DURATION", help_heading = heading::CONSUL)]
    pub vault_kill_active_at: Option<Secs>,

    // --- Consul dataplane ---
    /// Dataplane: take over existing proxies instead of registering, by
    /// proxy service ID pattern (e.g. 'web-sidecar-proxy-{i}'); with
    /// --adopt-node. Adopting registers and removes nothing.
    #[arg(long, value_name = "PATTERN", help_heading = heading::DATAPLANE)]
    pub adopt: Option<String>,
    /// Dataplane: the catalog node of each adopted proxy (e.g. 'node-{i}').
    #[arg(long, value_name = "PATTERN", help_heading = heading::DATAPLANE)]
    pub adopt_node: Option<String>,
    /// Dataplane: hold a WatchServers stream per sidecar, as consul-dataplane does.
    #[arg(long, help_heading = heading::DATAPLANE, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub watch_servers: Option<bool>,
    /// Dataplane: Envoy version the sidecars announce (node.user_agent_build_version),
    /// or `off` to send none.
    #[arg(long, value_name = "VERSION", help_heading = heading::DATAPLANE)]
    pub envoy_version: Option<Toggle<String>>,

    // --- Scenarios (docs/scenarios.md; also [[scenario]] sections) ---
    /// Close and reopen this share of the fleet's sessions per period,
    /// spread evenly (like deploys), e.g. 5%/30s.
    #[arg(long, value_name = "SHARE/PERIOD", help_heading = heading::SCENARIOS)]
    pub churn: Option<ChurnSpec>,
    /// End each session after this long ± 10 % (then reconnect per --reconnect).
    #[arg(long, value_name = "DURATION", help_heading = heading::SCENARIOS)]
    pub max_session_length: Option<Secs>,
    /// Drop a share of the connected sessions at once (repeatable):
    /// at=60s[,drop=100%].
    #[serde(
        rename = "storm",
        alias = "storms",
        deserialize_with = "crate::values::one_or_many"
    )]
    #[arg(
        long = "storm",
        value_name = "at=T[,drop=P%]",
        help_heading = heading::SCENARIOS
    )]
    pub storms: Vec<StormSpec>,
    /// Freeze agents: no reads, no writes, timers late, like a stopped
    /// process (repeatable): at=60s,for=30s[,share=100%].
    #[serde(
        rename = "pause",
        alias = "pauses",
        deserialize_with = "crate::values::one_or_many"
    )]
    #[arg(
        long = "pause",
        value_name = "at=T,for=D[,share=P%]",
        help_heading = heading::SCENARIOS
    )]
    pub pauses: Vec<PauseSpec>,
    /// Agents leave politely at this rate, the last one as the run ends
    /// (needs --duration), e.g. 200/s; or at=T,rate=R.
    #[arg(long, value_name = "RATE", help_heading = heading::SCENARIOS)]
    pub ramp_down: Option<RampDownSpec>,
    /// Delay between sessions: exponential (equal jitter, doubling from
    /// --reconnect-min to --reconnect-max), full-jitter, fixed (always
    /// --reconnect-min), none (at once: the synchronized burst) or
    /// sensu-agent (a real agent's: at once after a held session, then
    /// --reconnect-min, then doubling plus up to 100 % at random).
    #[arg(long, value_name = "POLICY", help_heading = heading::SCENARIOS)]
    pub reconnect: Option<ReconnectPolicy>,

    // --- Failover (docs/failover.md) ---
    /// Without --target: how many embedded servers to run (a Consul
    /// cluster's servers share one catalog; each server its own ports).
    #[arg(long, value_name = "N", help_heading = heading::FAILOVER)]
    pub embedded_servers: Option<usize>,
    /// Without --target: stop embedded server I at T, its connections
    /// closed as a real server's are, and start it again D later
    /// (repeatable): at=T,server=I,for=D.
    #[serde(
        rename = "server-down",
        alias = "server-downs",
        deserialize_with = "crate::values::one_or_many"
    )]
    #[arg(
        long = "server-down",
        value_name = "at=T,server=I,for=D",
        help_heading = heading::FAILOVER
    )]
    pub server_downs: Vec<ServerDown>,
    /// Consul: the router's shortest time between rebalances (Consul's 2m,
    /// plus up to half of it at random; longer past 7,680 nodes per
    /// server); shorten it to see a returned server get its share soon.
    #[arg(long, value_name = "DURATION", help_heading = heading::FAILOVER)]
    pub rebalance_min: Option<Secs>,

    /// Check schedule of the embedded Sensu target (demo mode only).
    #[arg(long, value_name = "DURATION", hide = true)]
    pub embedded_check_interval: Option<Secs>,
    /// Sensu: the embedded backend checks each agent's password with bcrypt
    /// at this cost, as Sensu's backend does (10: about 60 ms of CPU per
    /// connection); without it, a plain comparison. Demo mode only.
    #[arg(long, value_name = "COST", help_heading = heading::SENSU)]
    pub embedded_password_cost: Option<u32>,

    // --- Results ---
    /// Write the run summary JSON (schema agent-sim.summary.v2) here.
    #[arg(
        long,
        value_name = "PATH",
        help_heading = heading::RESULTS,
        env = "AGENT_SIM_SUMMARY"
    )]
    pub summary: Option<PathBuf>,
    /// Write every histogram as tagged HdrHistogram log intervals here.
    #[arg(
        long,
        value_name = "PATH",
        help_heading = heading::RESULTS,
        env = "AGENT_SIM_HLOG"
    )]
    pub hlog: Option<PathBuf>,
    /// Interval of --hlog records.
    #[arg(long, value_name = "DURATION", help_heading = heading::RESULTS)]
    pub hlog_interval: Option<Secs>,
    /// Serve Prometheus /metrics on this address (e.g. 127.0.0.1:9090).
    #[arg(long, value_name = "ADDR", help_heading = heading::RESULTS)]
    pub metrics_addr: Option<SocketAddr>,
    /// SLO assertion, e.g. 'propagation.p99 < 1s' (repeatable); exit 3 if any fails.
    #[serde(rename = "assert", alias = "asserts")]
    #[arg(long = "assert", value_name = "EXPR", help_heading = heading::RESULTS)]
    pub asserts: Vec<Assertion>,
    // --- capacity ---
    /// Grow the fleet in steps to find where the server breaks: the whole
    /// fleet's agents at each step, growing (e.g. 1000,2000,4000). Each step
    /// starts its new agents on --ramp or --boot-window, waits
    /// --step-settle, and is judged by the --slo over --step-hold alone.
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', help_heading = heading::CAPACITY)]
    pub steps: Vec<u64>,
    /// How long each step is held and judged.
    #[arg(long, value_name = "DURATION", help_heading = heading::CAPACITY)]
    pub step_hold: Option<Secs>,
    /// Time from a step's last start to its window (its agents' sessions
    /// settling).
    #[arg(long, value_name = "DURATION", help_heading = heading::CAPACITY)]
    pub step_settle: Option<Secs>,
    /// An SLO every step is judged by, in the --assert grammar (repeatable;
    /// default: the kind's, printed at start).
    #[serde(rename = "slo", alias = "slos")]
    #[arg(long = "slo", value_name = "EXPR", help_heading = heading::CAPACITY)]
    pub slos: Vec<Assertion>,
    /// Steps run past the first that fails, to show the breakdown.
    #[arg(long, value_name = "N", help_heading = heading::CAPACITY)]
    pub steps_past: Option<u64>,
    /// This process is shard I of N (I in 0..N): a disjoint slice of agents.
    /// With N alone, I comes from AGENT_SIM_SHARD_SLOT (a slot from 1:
    /// Docker Swarm's {{.Task.Slot}}), JOB_COMPLETION_INDEX (Kubernetes) or
    /// NOMAD_ALLOC_INDEX (Nomad).
    #[arg(
        long,
        value_name = "I/N",
        help_heading = heading::MULTI_BOX,
        env = "AGENT_SIM_SHARD"
    )]
    pub shard: Option<ShardSpec>,
    /// Run as N local processes (each a shard, one merged report); default:
    /// as many as the open-files hard limit needs, 1 when one fits.
    #[arg(long, value_name = "N", help_heading = heading::MULTI_BOX)]
    pub processes: Option<u64>,
    /// Seed for everything random that must be stable across runs.
    #[arg(long, value_name = "N", help_heading = heading::RESULTS)]
    pub seed: Option<u64>,
    /// No live progress (the final table is still printed).
    #[arg(long, short = 'q', help_heading = heading::RESULTS, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub quiet: Option<bool>,
    /// Interval of plain progress lines when stderr is not a terminal.
    #[arg(long, value_name = "DURATION", help_heading = heading::RESULTS)]
    pub progress_every: Option<Secs>,

    // --- Watching the server ---
    /// Scrape a server's metrics during the run (repeatable): a Prometheus
    /// URL, `consul` (each Consul server of the run: its
    /// /v1/agent/metrics?format=prometheus with the run's token and TLS),
    /// `sensu` (each backend's /metrics on its API port 8080), or
    /// `consul=ADDR` / `sensu=ADDR` to name the API address.
    #[serde(rename = "observe")]
    #[arg(long = "observe", value_name = "URL|consul|sensu", help_heading = heading::OBSERVE)]
    pub observe: Vec<ObserveSpec>,
    /// Also read a process on this host from /proc (CPU, RSS, threads, fds):
    /// a server that exposes no metrics (repeatable).
    #[serde(rename = "observe-pid")]
    #[arg(long = "observe-pid", value_name = "PID", help_heading = heading::OBSERVE)]
    pub observe_pid: Vec<u32>,
    /// Time between scrapes (the first ones, before any agent dials, are the
    /// baseline; each scrape times out at 80 % of this).
    #[arg(long, value_name = "DURATION", help_heading = heading::OBSERVE)]
    pub observe_every: Option<Secs>,
    /// Keep this series too, besides the server kind's defaults
    /// (repeatable; its exposed or snake_case name).
    #[serde(rename = "observe-metric")]
    #[arg(long = "observe-metric", value_name = "NAME", help_heading = heading::OBSERVE)]
    pub observe_metric: Vec<String>,
    /// The shard that observes, so that a merged report counts a server once.
    #[arg(long, value_name = "I", help_heading = heading::OBSERVE)]
    pub observe_shard: Option<u64>,

    // --- report page and table ---
    /// Write the report page here: one self-contained HTML file with the
    /// run's charts (docs/results.md#report-page).
    #[arg(long, value_name = "PATH", help_heading = heading::RESULTS)]
    pub report_html: Option<PathBuf>,
    /// The final table lists every counter with its total and average rate.
    #[arg(long, short = 'v', help_heading = heading::RESULTS, value_name = "BOOL", num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub verbose: Option<bool>,
}

/// Applies one macro to the list of every [`RunArgs`] field, by kind:
/// `vals` are `Option<T: Display>`, `paths` are `Option<PathBuf>`, `vecs`
/// are lists that a later layer replaces as a whole.
macro_rules! with_run_args_fields {
    ($m:ident) => {
        $m!(
            vals: kind, agents, duration, ramp, boot_window, max_dialing, reconnect_min, reconnect_max,
                shutdown_grace, name_prefix, threads, fail_fast, give_up_after, keepalive_interval,
                timer_tick, keepalive_warning_timeout, keepalive_critical_timeout, namespace, user,
                password, subscriptions, encoding, deregister, event_rate, event_output_size,
                insecure_skip_tls_verify, tls_server_name, http_target, token, acl_tokens, acl_token_rate, upstreams, services_per_agent,
                service_name, service_chain, sidecars, no_register, keep_registrations, session_ttl,
                anti_entropy, flap_rate, probe, probe_every, probe_timeout, probe_service, consul_agent, gossip, gossip_key, gossip_label, leaf_certs, rotate_ca_at, allow_ca_rotation, auto_encrypt, watch,
                blocking_wait, seed_service, change_every,
                proxies_per_agent, proxy_coalesce, proxy_update_rate,
                vault_nodes, vault_tokens, vault_token_ttl, vault_renew, vault_path, vault_stop_active_at,
                vault_kill_active_at,
                embedded_check_interval, embedded_password_cost, embedded_servers, rebalance_min, hlog_interval, metrics_addr, shard, seed, quiet,
                progress_every, adopt, adopt_node, watch_servers, envoy_version, verbose,
                churn, max_session_length, ramp_down, reconnect, observe_every, observe_shard,
                processes, step_hold, step_settle, steps_past;
            paths: config, ca_file, cert_file, key_file, summary, hlog, report_html;
            vecs: targets, source_addrs, asserts, gossip_join, gossip_bind, watch_kv,
                storms, pauses, server_downs, observe, observe_pid, observe_metric,
                vault_bursts, steps, slos
        )
    };
}
pub(crate) use with_run_args_fields;
