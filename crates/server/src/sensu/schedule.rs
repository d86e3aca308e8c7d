//! Check scheduling: one task per check publishes one pre-encoded `check_request` per
//! interval on the check's `watch` channel; sessions pick up the latest publication.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use agent_sim_proto::sensu::v2;
use agent_sim_sensu::codec::{self, CodecError};
use bytes::Bytes;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::stats::inc;
use super::{ENCODINGS, Publication, Shared};

/// Publishes check `idx` every interval, the first one interval from now, until
/// `shutdown`.
pub(super) async fn run(shared: Arc<Shared>, idx: usize, shutdown: CancellationToken) {
    let check = &shared.checks[idx];
    let period = check.spec.interval;
    let mut ticker = tokio::time::interval_at(Instant::now() + period, period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_issued = 0;
    loop {
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let issued = next_issued(unix_now(), last_issued);
        match build(&shared, idx, issued) {
            Ok(publication) => {
                last_issued = issued;
                // Before publishing, so that no reply can see an older value.
                check.last_issued.store(issued, Ordering::Relaxed);
                check.tx.send_replace(Some(Arc::new(publication)));
                inc(&shared.stats.check_requests_published);
            }
            // Cannot happen with the project's codec; counted rather than panicking.
            Err(_) => inc(&shared.stats.frames_invalid),
        }
    }
}

/// `issued` strictly increases per check: now, or `last + 1` if that second was used.
fn next_issued(now: i64, last: i64) -> i64 {
    if now > last { now } else { last + 1 }
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// The `CheckRequest` of check `idx` for namespace `namespace`.
fn request(shared: &Shared, idx: usize, namespace: &str, issued: i64) -> v2::CheckRequest {
    let check = &shared.checks[idx];
    v2::CheckRequest {
        config: Some(v2::CheckConfig {
            command: check.spec.command.clone(),
            interval: check.interval_secs,
            publish: true,
            subscriptions: check.spec.subscriptions.clone(),
            metadata: Some(v2::ObjectMeta {
                name: check.spec.name.clone(),
                namespace: namespace.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        issued,
        ..Default::default()
    }
}

/// Encodes one publication: every namespace × every encoding.
fn build(shared: &Shared, idx: usize, issued: i64) -> Result<Publication, CodecError> {
    let mut frames = Vec::with_capacity(shared.namespaces.len() * ENCODINGS.len());
    for ns in &shared.namespaces {
        let req = request(shared, idx, ns, issued);
        for enc in ENCODINGS {
            let body = codec::encode_check_request(&req, enc)?;
            frames.push(Bytes::from(codec::encode_frame(
                codec::KIND_CHECK_REQUEST,
                &body,
            )));
        }
    }
    Ok(Publication {
        frames: frames.into_boxed_slice(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issued_strictly_increases_within_a_second() {
        assert_eq!(next_issued(100, 0), 100);
        assert_eq!(next_issued(100, 100), 101);
        assert_eq!(next_issued(100, 101), 102);
        assert_eq!(next_issued(105, 102), 105);
    }
}
