//! A server that takes the pool's push-pulls but never acks a probe: the
//! probes time out (counted), the server is suspected (and the suspicion
//! passed on), and nothing waits for an ack past the probe timeout. Joins
//! on real time; the probes on paused time.

use std::net::SocketAddr;
use std::time::Duration;

use agent_sim_gossip::serf::{self, SerfState};
use agent_sim_gossip::wire::msgs::{NodeState, PushPull};
use agent_sim_gossip::{Pool, PoolConfig, Security, Timings, names};
use agent_sim_metrics::Metrics;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Answers every push-pull with one Consul server at `udp` (which no one
/// reads).
async fn fake_server(l: tokio::net::TcpListener, udp: SocketAddr) {
    let sec = Security::default();
    loop {
        let Ok((mut c, _)) = l.accept().await else {
            return;
        };
        let sec = sec.clone();
        tokio::spawn(async move {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Ok(n) = c.read(&mut chunk).await else {
                    return;
                };
                if n == 0 {
                    return;
                }
                buf.extend_from_slice(&chunk[..n]);
                if let Ok(Some(_)) = sec.open_stream(&buf) {
                    break;
                }
            }
            let meta = serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
            let mut user = Vec::new();
            SerfState {
                ltime: 1,
                status: vec![("srv", 1)],
                ..Default::default()
            }
            .encode(&mut user);
            let ip = match udp {
                SocketAddr::V4(v) => v.ip().octets().to_vec(),
                SocketAddr::V6(_) => unreachable!(),
            };
            let mut out = Vec::new();
            PushPull {
                join: false,
                nodes: vec![NodeState {
                    name: "srv",
                    addr: &ip,
                    port: udp.port(),
                    meta: &meta,
                    incarnation: 1,
                    state: 0,
                    vsn: &[1, 5, 2, 2, 5, 4],
                }],
                user_state: &user,
            }
            .encode(&mut out);
            let _ = c.write_all(&sec.seal_stream(&out)).await;
        });
    }
}

#[tokio::test]
async fn probes_of_a_server_that_never_acks_time_out_and_suspect_it() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let join = l.local_addr().unwrap();
    let deaf = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    tokio::spawn(fake_server(l, deaf.local_addr().unwrap()));
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let cfg = PoolConfig {
        bind: vec!["127.0.0.1:0".parse().unwrap()],
        join: vec![join],
        security: Security::default(),
        tags: vec![("role".into(), "node".into()), ("dc".into(), "dc1".into())],
        timings: Timings::default(),
    };
    let pool = Pool::start(cfg, metrics.clone()).await.unwrap();
    for i in 0..10u64 {
        let (slot, _) = pool.add(&format!("m{i}"), &format!("id-{i}"), i);
        pool.join(slot).await.unwrap();
    }
    assert_eq!(pool.census(), (10, 0, 0));
    tokio::time::pause();
    // 10 members, 1 server: the server gets 10/10 = 1 probe a second.
    for _ in 0..100 {
        tokio::time::advance(Duration::from_millis(100)).await;
        tokio::task::yield_now().await;
    }
    let sent = metrics.get(metrics.counter(names::PROBES));
    let timeouts = metrics.get(metrics.counter(names::PROBE_TIMEOUTS));
    assert!(sent >= 3, "probes sent {sent}");
    // Each probe times out 500 ms after it went; the last may still wait.
    assert!(
        timeouts + 1 >= sent && timeouts >= 2,
        "{timeouts} of {sent}"
    );
    assert_eq!(pool.waiting(), (sent - timeouts) as usize);
    assert!(pool.waiting() <= 1);
    assert_eq!(pool.suspected_servers(), 1);
    pool.stop();
}
