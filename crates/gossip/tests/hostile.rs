//! Hostile gossip bytes: whatever a peer sends, every decoder and the
//! shared view stay bounded and never panic (the fuzz targets run the same
//! code for longer, `fuzz/fuzz_targets/gossip_*`).

use crate::receive;

use agent_sim_gossip::wire::msgs::{NodeState, PushPull, PushPullHeader};
use agent_sim_gossip::wire::{Security, compound, kind};
use proptest::prelude::*;

/// A valid message to mutate: an alive, a compound of two, a push-pull.
fn seeds() -> Vec<Vec<u8>> {
    let mut alive = Vec::new();
    agent_sim_gossip::wire::msgs::Alive {
        incarnation: 1,
        node: "n",
        addr: &[127, 0, 0, 1],
        port: 8301,
        meta: &[0xff, 0x80],
        vsn: &[1, 5, 2, 2, 5, 4],
    }
    .encode(&mut alive);
    let c = compound(&[&alive, &alive]);
    let mut pp = Vec::new();
    PushPull {
        join: false,
        nodes: vec![NodeState {
            name: "n",
            addr: &[127, 0, 0, 1],
            port: 8301,
            ..Default::default()
        }],
        user_state: &[2, 0x80],
    }
    .encode(&mut pp);
    vec![alive, c, pp]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_packets_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1500)) {
        receive::packet(&bytes);
        receive::stream(&bytes);
    }

    #[test]
    fn mutated_messages_never_panic(which in 0usize..3, at in any::<prop::sample::Index>(), b in any::<u8>(), cut in any::<prop::sample::Index>()) {
        let mut m = seeds()[which].clone();
        let i = at.index(m.len());
        m[i] = b;
        m.truncate(cut.index(m.len() + 1).max(1));
        receive::packet(&m);
        receive::stream(&m);
        let wrapped = Security::default().seal_packet(&m);
        receive::packet(&wrapped);
    }
}

#[test]
fn a_push_pull_claiming_millions_of_members_costs_its_own_size() {
    let mut b = Vec::new();
    PushPullHeader {
        nodes: 5_000_000,
        user_state_len: 0,
        join: true,
    }
    .encode(&mut b);
    b.extend_from_slice(&[0x80; 64]);
    assert!(Security::default().open_stream(&b).is_err() || PushPull::decode(&b[1..]).is_err());
    receive::stream(&b);
}

#[test]
fn a_compressed_bomb_is_refused_past_the_bound() {
    // 60 MiB of zeros compress to a few hundred KiB of LZW: past the 40
    // MiB a push-pull may decompress to, refused.
    let big = vec![0u8; 60 << 20];
    let mut msg = vec![kind::PUSH_PULL];
    msg.extend_from_slice(&big);
    let z = agent_sim_gossip::wire::compress_msg(&msg);
    let e = Security::default().open_stream(&z).unwrap_err();
    assert_eq!(e.cause(), "oversized");
}

/// A member's gossip port, as a server reaches it: a datagram that cannot
/// be read is named by its size and first bytes, and a stream the server
/// opens and closes before a whole message is its own kind, not a bad
/// packet.
#[tokio::test]
async fn what_a_server_sent_is_named_and_a_stream_it_cut_is_not_a_bad_packet() {
    use agent_sim_gossip::{Pool, PoolConfig, Timings};
    use agent_sim_metrics::Metrics;
    use tokio::io::AsyncWriteExt;

    let server = crate::fake_server::FakeServer::start().await;
    let metrics = Metrics::new(&agent_sim_gossip::metrics_spec(), 2);
    let pool = Pool::start(
        PoolConfig {
            bind: vec!["127.0.0.1:0".parse().unwrap()],
            join: vec![server.join],
            security: Security::default(),
            tags: vec![("role".into(), "node".into())],
            timings: Timings::default(),
        },
        metrics.clone(),
    )
    .await
    .unwrap();
    let (_, member) = pool.add("m0", "id-0", 0);

    // A compound that claims two parts of 200 bytes in 12.
    let udp = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let dgram = [kind::COMPOUND, 2, 0, 200, 0, 200, 1, 2, 3, 4, 5, 6];
    udp.send_to(&dgram, member).await.unwrap();
    // A push-pull header and nothing more, then the stream closed.
    let mut tcp = tokio::net::TcpStream::connect(member).await.unwrap();
    tcp.write_all(&[kind::PUSH_PULL, 0x83, 0xa5]).await.unwrap();
    drop(tcp);

    let sample = |k: &str| metrics.error_sample(k);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while (sample("gossip_bad_packet").is_none() || sample("gossip_stream_cut").is_none())
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let bad = sample("gossip_bad_packet").expect("the datagram is counted");
    assert!(
        bad.starts_with("truncated from 127.0.0.1:")
            && bad.ends_with("(a datagram of 12 bytes: 07 02 00 c8 00 c8 01 02 03 04 05 06)"),
        "{bad}"
    );
    let cut = sample("gossip_stream_cut").expect("the stream is counted");
    assert!(
        cut.contains("the peer closed the stream after 3 bytes, before a whole message"),
        "{cut}"
    );
    assert_eq!(
        metrics.error_speaker("gossip_stream_cut"),
        agent_sim_metrics::Speaker::Server
    );
    pool.stop();
}
