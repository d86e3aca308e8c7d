//! How agents get into the embedded Sensu endpoint: the password checked with
//! bcrypt at a cost (counted, with its CPU time), and on a TLS port a client
//! certificate signed by the agent CA (no password check, the user is its
//! CN), a certificate from another CA refused in the TLS handshake. Clients
//! are tokio-tungstenite over tokio-rustls on 127.0.0.1:0; certificates are
//! made with rcgen for each test.

#![cfg(feature = "sensu")]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_sim_net::{ClientTls, MaybeTlsStream};
use agent_sim_proto::sensu::v2;
use agent_sim_sensu::codec::{self, Encoding};
use agent_sim_server::sensu::{SensuTargetConfig, SensuTargetSnapshot, SensuTargetStats, serve};
use agent_sim_testkit::bounded::until;
use base64::Engine as _;
use futures_util::{SinkExt as _, StreamExt as _};
use prost::Message as _;
use tokio::net::{TcpListener, TcpStream};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest as _;
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_util::sync::{CancellationToken, DropGuard};

type Ws = WebSocketStream<MaybeTlsStream>;

/// A CA, the server's certificate, an agent certificate (CN `agent-cn`)
/// signed by the CA and one signed by another CA, as PEM files in a fresh
/// directory (removed on drop).
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn new(tag: &str) -> Certs {
        let dir =
            std::env::temp_dir().join(format!("agent-sim-sensu-auth-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, pem: String| std::fs::write(dir.join(name), pem).unwrap();
        let new_ca = |name: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            let cert = p.self_signed(&key).unwrap();
            (cert, rcgen::Issuer::new(p, key))
        };
        let leaf = |issuer: &rcgen::Issuer<'_, rcgen::KeyPair>, names: &[&str], cn: &str| {
            let key = rcgen::KeyPair::generate().unwrap();
            let names = names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
            let mut p = rcgen::CertificateParams::new(names).unwrap();
            p.distinguished_name.push(rcgen::DnType::CommonName, cn);
            (
                p.signed_by(&key, issuer).unwrap().pem(),
                key.serialize_pem(),
            )
        };
        let (ca_cert, ca) = new_ca("agent-sim test CA");
        let (_, other) = new_ca("another CA");
        write("ca.pem", ca_cert.pem());
        let (c, k) = leaf(&ca, &["127.0.0.1", "localhost"], "backend");
        write("server.pem", c);
        write("server-key.pem", k);
        let (c, k) = leaf(&ca, &["agent-cn"], "agent-cn");
        write("agent.pem", c);
        write("agent-key.pem", k);
        let (c, k) = leaf(&other, &["agent-cn"], "agent-cn");
        write("stranger.pem", c);
        write("stranger-key.pem", k);
        Certs { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The TLS settings of the endpoint, with the agent CA or without.
    fn server(&self, agent_ca: bool) -> Arc<rustls::ServerConfig> {
        let ca = self.path("ca.pem");
        agent_sim_server::sensu::tls::server_config(
            &self.path("server.pem"),
            &self.path("server-key.pem"),
            agent_ca.then_some(ca.as_path()),
        )
        .unwrap()
    }

    /// A client trusting the CA, presenting `cert` (`agent` or `stranger`).
    fn client(&self, cert: Option<&str>) -> Arc<rustls::ClientConfig> {
        let t = ClientTls {
            ca_file: Some(self.path("ca.pem")),
            cert_file: cert.map(|c| self.path(&format!("{c}.pem"))),
            key_file: cert.map(|c| self.path(&format!("{c}-key.pem"))),
            ..ClientTls::default()
        };
        agent_sim_net::client_config(&t, &[]).unwrap()
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

struct Target {
    addr: SocketAddr,
    stats: Arc<SensuTargetStats>,
    _stop: DropGuard,
}

async fn start(cfg: SensuTargetConfig) -> Target {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stats = Arc::new(SensuTargetStats::default());
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, cfg, stats.clone(), stop.clone()));
    Target {
        addr,
        stats,
        _stop: stop.drop_guard(),
    }
}

/// The upgrade of an agent with these credentials, over TLS with `tls`.
async fn connect(
    addr: SocketAddr,
    tls: Option<Arc<rustls::ClientConfig>>,
    password: &str,
) -> Result<Ws, WsError> {
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    let mut req = format!("{scheme}://{addr}/").into_client_request().unwrap();
    let token = base64::engine::general_purpose::STANDARD.encode(format!("agent:{password}"));
    let h = req.headers_mut();
    h.insert("Authorization", format!("Basic {token}").parse().unwrap());
    h.insert("Sensu-User", "agent".parse().unwrap());
    h.insert("Sensu-Namespace", "default".parse().unwrap());
    h.insert("Sensu-AgentName", "a-1".parse().unwrap());
    h.insert("Accept", "application/octet-stream".parse().unwrap());
    let tcp = TcpStream::connect(addr).await.unwrap();
    let stream = match tls {
        Some(cfg) => {
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            let tls = tokio_rustls::TlsConnector::from(cfg)
                .connect(name, tcp)
                .await?;
            MaybeTlsStream::Tls(Box::new(tls))
        }
        None => MaybeTlsStream::Plain(tcp),
    };
    tokio_tungstenite::client_async(req, stream)
        .await
        .map(|(ws, _)| ws)
}

fn status(r: Result<Ws, WsError>) -> u16 {
    match r {
        Err(WsError::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => 101,
    }
}

/// The stats once `pred` holds (bounded).
async fn wait_for(
    stats: &SensuTargetStats,
    pred: impl Fn(&SensuTargetSnapshot) -> bool,
) -> SensuTargetSnapshot {
    until(
        Duration::from_secs(10),
        "the target's counters",
        async || {
            let s = stats.snapshot();
            pred(&s).then_some(s)
        },
    )
    .await
}

fn by_auth(s: &SensuTargetSnapshot, way: &str) -> u64 {
    s.upgrades_accepted_by_auth.get(way).copied().unwrap_or(0)
}

#[tokio::test]
async fn with_a_cost_every_password_connect_is_a_bcrypt_check() {
    let t = start(SensuTargetConfig {
        password_cost: Some(4),
        ..SensuTargetConfig::default()
    })
    .await;
    for _ in 0..2 {
        assert_eq!(status(connect(t.addr, None, "P@ssw0rd!").await), 101);
    }
    assert_eq!(status(connect(t.addr, None, "wrong").await), 401);
    let s = wait_for(&t.stats, |s| s.upgrades_accepted == 2).await;
    assert_eq!(by_auth(&s, "password"), 2);
    assert_eq!(by_auth(&s, "certificate"), 0);
    // Right and wrong passwords alike cost a check.
    assert_eq!(s.bcrypt_checks, 3);
    assert!(s.bcrypt_cpu_us > 0, "{s:?}");
    assert_eq!(s.rejected_credentials, 1);
}

#[tokio::test]
async fn without_a_cost_passwords_are_compared_with_no_check() {
    let t = start(SensuTargetConfig::default()).await;
    assert_eq!(status(connect(t.addr, None, "P@ssw0rd!").await), 101);
    assert_eq!(status(connect(t.addr, None, "wrong").await), 401);
    let s = wait_for(&t.stats, |s| s.upgrades_accepted == 1).await;
    assert_eq!((s.bcrypt_checks, s.bcrypt_cpu_us), (0, 0));
    assert_eq!(by_auth(&s, "password"), 1);
}

#[tokio::test]
async fn a_certificate_from_the_agent_ca_lets_an_agent_in_without_its_password() {
    let certs = Certs::new("good");
    let t = start(SensuTargetConfig {
        password_cost: Some(4),
        tls: Some(certs.server(true)),
        ..SensuTargetConfig::default()
    })
    .await;
    // The certificate wins over a wrong password: no check is made.
    let mut ws = connect(t.addr, Some(certs.client(Some("agent"))), "wrong")
        .await
        .expect("upgrade accepted");
    let s = wait_for(&t.stats, |s| s.upgrades_accepted == 1).await;
    assert_eq!(by_auth(&s, "certificate"), 1);
    assert_eq!(s.bcrypt_checks, 0);
    // The session's user is the certificate's CN.
    let config = entity_config_after_keepalive(&mut ws).await;
    assert_eq!(config.user, "agent-cn");

    // No certificate on the same port: the password, checked.
    assert_eq!(
        status(connect(t.addr, Some(certs.client(None)), "P@ssw0rd!").await),
        101
    );
    assert_eq!(
        status(connect(t.addr, Some(certs.client(None)), "wrong").await),
        401
    );
    let s = wait_for(&t.stats, |s| s.upgrades_accepted == 2).await;
    assert_eq!(by_auth(&s, "password"), 1);
    assert_eq!(s.bcrypt_checks, 2);
    assert_eq!(s.tls_handshake_errors, 0);
}

#[tokio::test]
async fn a_certificate_from_another_ca_fails_the_tls_handshake() {
    let certs = Certs::new("stranger");
    let t = start(SensuTargetConfig {
        password_cost: Some(4),
        tls: Some(certs.server(true)),
        ..SensuTargetConfig::default()
    })
    .await;
    let r = connect(t.addr, Some(certs.client(Some("stranger"))), "P@ssw0rd!").await;
    // TLS 1.3: the client's side of the handshake is over before the
    // server reads its certificate, so the refusal (an alert) comes on the
    // first read.
    match r {
        Err(WsError::Io(e)) => {
            let alert = e
                .get_ref()
                .and_then(|e| e.downcast_ref::<rustls::Error>())
                .cloned();
            assert!(
                matches!(alert, Some(rustls::Error::AlertReceived(_))),
                "{e:?}"
            );
        }
        other => panic!("expected the server's alert, got {:?}", other.map(|_| ())),
    }
    let s = wait_for(&t.stats, |s| s.tls_handshake_errors == 1).await;
    assert_eq!(s.rejected_client_cert, 1);
    assert_eq!((s.upgrades_accepted, s.bcrypt_checks), (0, 0));
}

#[tokio::test]
async fn without_an_agent_ca_no_certificate_is_asked_for() {
    let certs = Certs::new("no-ca");
    let t = start(SensuTargetConfig {
        tls: Some(certs.server(false)),
        ..SensuTargetConfig::default()
    })
    .await;
    // The client would present one if asked; it is not, so the password counts.
    let agent = certs.client(Some("agent"));
    assert_eq!(
        status(connect(t.addr, Some(agent.clone()), "wrong").await),
        401
    );
    assert_eq!(status(connect(t.addr, Some(agent), "P@ssw0rd!").await), 101);
    let s = wait_for(&t.stats, |s| s.upgrades_accepted == 1).await;
    assert_eq!(by_auth(&s, "password"), 1);
    assert_eq!(by_auth(&s, "certificate"), 0);
}

/// Sends a keepalive and returns the `entity_config` the backend pushes
/// for it (after the placeholder).
async fn entity_config_after_keepalive(ws: &mut Ws) -> agent_sim_proto::sensu::v3::EntityConfig {
    let meta = |name: &str| {
        Some(v2::ObjectMeta {
            name: name.to_owned(),
            namespace: "default".to_owned(),
            ..Default::default()
        })
    };
    let keepalive = v2::Event {
        timestamp: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64,
        entity: Some(v2::Entity {
            entity_class: "agent".to_owned(),
            metadata: meta("a-1"),
            subscriptions: vec!["entity:a-1".to_owned()],
            ..Default::default()
        }),
        check: Some(v2::Check {
            metadata: meta("keepalive"),
            interval: 20,
            timeout: 120,
            ..Default::default()
        }),
        metadata: meta(""),
        id: vec![0x42; 16],
        sequence: 1,
        ..Default::default()
    };
    let body = codec::encode_event(&keepalive, Encoding::Protobuf).unwrap();
    ws.send(Message::binary(codec::encode_frame(
        codec::KIND_KEEPALIVE,
        &body,
    )))
    .await
    .unwrap();
    let mut configs = 0;
    loop {
        let msg = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame in time")
            .expect("stream open")
            .expect("read ok");
        let Message::Binary(p) = msg else { continue };
        let f = codec::split_frame(&p).unwrap();
        if f.kind == codec::KIND_ENTITY_CONFIG {
            configs += 1;
            if configs == 2 {
                return agent_sim_proto::sensu::v3::EntityConfig::decode(f.body).unwrap();
            }
        }
    }
}
