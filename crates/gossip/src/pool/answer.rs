//! A member's join answer read as it arrives: the server's whole member
//! list (up to 2 MiB at 10,000 members) is checked from its first bytes (a
//! push-pull, or the error a server sends) and read through one fixed
//! window, each read counted, never held whole. The pool learnt the
//! cluster at its hello and keeps learning it from its periodic
//! push-pulls, so a join's list is not merged: it is counted ([`Learnt`]:
//! the alive members listed, the servers among them), for the member's
//! re-announcement of them (`reannounce`). A compressed answer that is the
//! same bytes as the last one decoded (the embedded server shares one
//! between the joins of 250 ms) is passed over and its count recalled
//! (`memo`).
//!
//! What is held at once: the window ([`WINDOW`]), in which each msgpack
//! value read must fit whole (a node state takes well under 1 KiB:
//! memberlist caps a node's meta at 512 bytes; a larger one is refused as
//! oversized); a compressed answer (a real server compresses every
//! stream) is decoded as it arrives, through a second window of the same
//! size and the decoder's 12 KiB table. The exception is an encrypted answer: AES-GCM
//! authenticates a frame only at its end and `ring` opens a frame whole, so
//! nothing of it can be trusted (not even its type) before all of it is in;
//! it is held, at most memberlist's 20 MiB (refused from its 5-byte header
//! past that), as every push-pull was before.
//!
//! Limits: memberlist's where they apply to what is read here (serf's
//! state at most 20 MiB, an encrypted frame at most 20 MiB); a plain
//! answer's total size is not bound (memberlist reads a plain push-pull as
//! it arrives too), only by the stream's deadline: none of it is held.
//!
//! Not here: the connection and its deadline (`net`), the counters.

use tokio::io::{AsyncRead, AsyncReadExt};

use super::memo::{Key, Memos, Step};
use crate::serf::TAGS_MAGIC;
use crate::wire::msgs::{self, Alive, NodeState, PushPullHeader, state};
use crate::wire::read::Reader;
use crate::wire::{Frame, MAX_DECOMPRESSED, MAX_STATE_BYTES, Security, WireError, kind, lzw};

/// The window an answer is read through.
pub const WINDOW: usize = 16 * 1024;
/// LZW bytes enough for a compressed message's type byte (a clear code and
/// the first code: 18 bits).
const TYPE_PREFIX: usize = 16;

/// What a push-pull's answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// A push-pull.
    PushPull,
    /// memberlist's error message, in the server's words.
    Error(String),
    /// Another message (or a compressed one that does not say its type).
    Other,
}

/// What a join's answer taught its member, as memberlist's `mergeState` of
/// a fresh node takes it: every alive member listed but itself is new to
/// it, so each is re-announced; suspect, dead and left ones are not (a
/// fresh node ignores news of members it does not know).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Learnt {
    /// Alive members listed, the member itself apart.
    pub members: u64,
    /// Of those, Consul servers (`role=consul`).
    pub servers: u64,
    /// The bytes of the alive messages of the first [`SAMPLED`] of them.
    sampled_bytes: u64,
    /// How many were sized.
    sampled: u64,
}

/// Members whose alive message is sized (the mean is what sets how many
/// fit in a packet; sizing every one would cost an encoding each).
const SAMPLED: u64 = 64;

impl Learnt {
    /// The mean size of the learnt members' alive messages (`None` when
    /// none was learnt).
    pub fn alive_len(&self) -> Option<usize> {
        (self.sampled > 0).then(|| self.sampled_bytes.div_ceil(self.sampled) as usize)
    }
}

#[cfg(test)]
impl Learnt {
    /// `members` learnt, `servers` of them, their alive messages
    /// `alive_len` bytes.
    pub fn of(members: u64, servers: u64, alive_len: u64) -> Learnt {
        Learnt {
            members,
            servers,
            sampled_bytes: alive_len,
            sampled: 1,
        }
    }
}

/// Whether a node's meta says it is a Consul server (serf's tags, or an old
/// role-only meta), read without allocating.
fn is_server(meta: &[u8]) -> bool {
    let Some((&TAGS_MAGIC, tags)) = meta.split_first() else {
        return meta == b"consul";
    };
    let mut consul = false;
    let _ = Reader::new(tags).fields(|k, r| {
        let v = r.str()?;
        consul |= k == "role" && v == "consul";
        Ok(())
    });
    consul
}

/// A push-pull's members counted as its bytes come (after its type
/// byte): its header, then each node state, read whole.
struct Tally<'a> {
    /// The joining member's name.
    me: &'a str,
    /// Node states still to come (`None` before the header).
    left: Option<usize>,
    /// The header's length of serf's state, after the node states.
    user_state: usize,
    learnt: Learnt,
    /// Where an alive message is sized.
    scratch: Vec<u8>,
}

impl<'a> Tally<'a> {
    fn new(me: &'a str) -> Self {
        Tally {
            me,
            left: None,
            user_state: 0,
            learnt: Learnt::default(),
            scratch: Vec::new(),
        }
    }

    /// Every node state has been read.
    fn done(&self) -> bool {
        self.left == Some(0)
    }

    /// Reads the whole values at the start of `b` (the header, node
    /// states); the bytes used (a value cut short is left for more).
    fn take(&mut self, b: &[u8]) -> Result<usize, WireError> {
        let mut r = Reader::new(b);
        let mut used = 0;
        loop {
            let read = match self.left {
                Some(0) => return Ok(used),
                None => PushPullHeader::read_head(&mut r).map(|h| {
                    self.left = Some(h.nodes);
                    self.user_state = h.user_state_len;
                }),
                Some(k) => NodeState::read(&mut r).map(|n| {
                    self.count(&n);
                    self.left = Some(k - 1);
                }),
            };
            match read {
                Ok(()) => used = r.position(),
                Err(WireError::Truncated) => return Ok(used),
                Err(e) => return Err(e),
            }
        }
    }

    fn count(&mut self, n: &NodeState<'_>) {
        if n.state != state::ALIVE || n.name == self.me {
            return;
        }
        let l = &mut self.learnt;
        l.members += 1;
        l.servers += u64::from(is_server(n.meta));
        if l.sampled < SAMPLED {
            self.scratch.clear();
            Alive {
                incarnation: n.incarnation,
                node: n.name,
                addr: n.addr,
                port: n.port,
                meta: n.meta,
                vsn: n.vsn,
            }
            .encode(&mut self.scratch);
            l.sampled += 1;
            l.sampled_bytes += self.scratch.len() as u64;
        }
    }
}

/// A compressed push-pull's members counted as its bytes come: decoded a
/// window at a time, each window's whole values counted, the rest of the
/// stream passed over once every node state is.
struct Inflate<'a> {
    decoder: Box<lzw::Decoder>,
    /// Decoded bytes not yet counted (a value cut short).
    plain: Vec<u8>,
    /// The message's type byte is behind.
    typed: bool,
    tally: Tally<'a>,
}

impl<'a> Inflate<'a> {
    fn new(me: &'a str) -> Self {
        Inflate {
            decoder: Box::default(),
            plain: Vec::new(),
            typed: false,
            tally: Tally::new(me),
        }
    }

    /// Decodes and counts the next compressed bytes.
    fn feed(&mut self, mut input: &[u8]) -> Result<(), WireError> {
        while !input.is_empty() && !self.tally.done() && !self.decoder.ended() {
            let used = self.decoder.feed(input, &mut self.plain, WINDOW)?;
            input = &input[used..];
            let mut at = 0;
            if !self.typed && !self.plain.is_empty() {
                (at, self.typed) = (1, true);
            }
            at += self.tally.take(&self.plain[at..])?;
            self.plain.drain(..at);
            if self.plain.len() >= WINDOW {
                return Err(WireError::TooLarge(WINDOW));
            }
        }
        Ok(())
    }

    /// What it taught, once all of it was fed (a message that ends before
    /// its node states is cut short).
    fn learnt(&self) -> Result<Learnt, WireError> {
        match self.tally.done() {
            true => Ok(self.tally.learnt),
            false => Err(WireError::Truncated),
        }
    }
}

/// What a whole push-pull (a frame read whole: an encrypted answer)
/// taught the member.
fn learnt_of(frame: &Frame, me: &str) -> Result<Learnt, WireError> {
    match frame {
        Frame::Plain(m) => {
            let mut t = Tally::new(me);
            t.take(m.get(1..).unwrap_or_default())?;
            match t.done() {
                true => Ok(t.learnt),
                false => Err(WireError::Truncated),
            }
        }
        Frame::Compressed(body) => {
            let mut buf: &[u8] = &[];
            Reader::new(body).fields(|k, r| {
                match k {
                    "Buf" => buf = r.bytes()?,
                    _ => r.skip()?,
                }
                Ok(())
            })?;
            let mut inf = Inflate::new(me);
            inf.feed(buf)?;
            inf.learnt()
        }
    }
}

/// What a whole stream message is (a frame read whole: an exchange's
/// answer, or an encrypted join answer).
pub(super) fn reply_of(frame: &Frame) -> Result<Reply, WireError> {
    match frame.kind() {
        Ok(kind::PUSH_PULL) => Ok(Reply::PushPull),
        Ok(kind::ERR) => {
            let words = frame.clone().message()?;
            Ok(Reply::Error(error_words(&words[1..])))
        }
        _ => Ok(Reply::Other),
    }
}

/// An error message's words (empty when they do not decode, as memberlist
/// logs an error it cannot read).
fn error_words(body: &[u8]) -> String {
    msgs::decode_err(body).unwrap_or_default()
}

/// Reads member `me`'s join answer from `conn` to its end (a push-pull) or
/// as far as it tells what it is, passing each read's size to `count`:
/// what it is, and what a push-pull taught the member. A stream that ends
/// (or fails) early is [`WireError::Truncated`].
pub(super) async fn read_reply<R: AsyncRead + Unpin>(
    sec: &Security,
    me: &str,
    conn: &mut R,
    count: &mut (dyn FnMut(usize) + Send),
    memos: &Memos<Learnt>,
) -> Result<(Reply, Learnt), WireError> {
    let mut w = Window {
        conn,
        buf: vec![0; WINDOW].into_boxed_slice(),
        at: 0,
        end: 0,
        count,
    };
    w.fill(1).await?;
    let first = w.held()[0];
    // A whole frame's checks that its first byte decides: encrypted where
    // this pool encrypts (and only there), a known message type. No frame
    // is whole in one byte, so this is an error or `None`.
    sec.open_stream_frame(&[first])?;
    if first == kind::ENCRYPT {
        return held_frame(&mut w, sec, me).await;
    }
    w.consume(1);
    let nothing = Learnt::default();
    match first {
        kind::PUSH_PULL => {
            let mut t = Tally::new(me);
            loop {
                let used = t.take(w.held())?;
                w.consume(used);
                if t.done() {
                    break;
                }
                w.more().await?;
            }
            w.drain(t.user_state).await?;
            Ok((Reply::PushPull, t.learnt))
        }
        kind::COMPRESS => compressed(&mut w, me, memos).await,
        kind::ERR => {
            let words = w
                .parse(|r| {
                    let body = r.rest();
                    r.skip()?;
                    Ok(error_words(&body[..r.position()]))
                })
                .await?;
            Ok((Reply::Error(words), nothing))
        }
        _ => Ok((Reply::Other, nothing)),
    }
}

/// An encrypted answer, held whole (the module's doc says why).
async fn held_frame<R: AsyncRead + Unpin>(
    w: &mut Window<'_, R>,
    sec: &Security,
    me: &str,
) -> Result<(Reply, Learnt), WireError> {
    w.fill(5).await?;
    let h = w.held();
    let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
    if len > MAX_STATE_BYTES {
        return Err(WireError::TooLarge(MAX_STATE_BYTES));
    }
    let mut frame = Vec::with_capacity(5 + len);
    w.take_into(&mut frame, 5 + len).await?;
    let (f, _) = sec.open_stream_frame(&frame)?.ok_or(WireError::Truncated)?;
    drop(frame);
    match reply_of(&f)? {
        Reply::PushPull => Ok((Reply::PushPull, learnt_of(&f, me)?)),
        other => Ok((other, Learnt::default())),
    }
}

/// A compress message's fields (`Algo`, `Buf`, or one not read).
enum Field {
    Algo,
    Buf,
    Other,
}

/// A compress message `{Algo, Buf}`: its type from `Buf`'s first bytes;
/// a push-pull's `Buf` decoded as it comes and its members counted, any
/// other's drained (an error's `Buf` is held, at most the window:
/// memberlist's error is one sentence).
async fn compressed<R: AsyncRead + Unpin>(
    w: &mut Window<'_, R>,
    me: &str,
    memos: &Memos<Learnt>,
) -> Result<(Reply, Learnt), WireError> {
    let fields = w.parse(|r| r.map()).await?;
    let (mut algo, mut first, mut words) = (0, None, None);
    let mut learnt = Learnt::default();
    for _ in 0..fields {
        let field = w
            .parse(|r| {
                Ok(match r.str()? {
                    "Algo" => Field::Algo,
                    "Buf" => Field::Buf,
                    _ => Field::Other,
                })
            })
            .await?;
        match field {
            Field::Algo => algo = w.parse(|r| r.uint()).await?,
            Field::Other => w.parse(|r| r.skip()).await?,
            Field::Buf => {
                let len = w.parse_with(bytes_header).await?;
                let head = len.min(TYPE_PREFIX);
                w.fill(head).await?;
                first = lzw::decompress_prefix(&w.held()[..head], 1)
                    .ok()
                    .and_then(|b| b.first().copied());
                // Go writes `Algo` first: an unknown one is not decoded.
                if first == Some(kind::PUSH_PULL) && algo == 0 {
                    learnt = push_pull_buf(w, len, me, memos).await?;
                    continue;
                }
                if first != Some(kind::ERR) {
                    w.drain(len).await?;
                    continue;
                }
                if len > WINDOW {
                    return Err(WireError::TooLarge(WINDOW));
                }
                w.fill(len).await?;
                let msg = lzw::decompress(&w.held()[..len], MAX_DECOMPRESSED)?;
                words = Some(error_words(msg.get(1..).unwrap_or_default()));
                w.consume(len);
            }
        }
    }
    // As a whole frame's type: an unknown algorithm does not say it.
    Ok(match (algo, first, words) {
        (0, Some(kind::PUSH_PULL), _) => (Reply::PushPull, learnt),
        (0, Some(kind::ERR), Some(words)) => (Reply::Error(words), Learnt::default()),
        _ => (Reply::Other, Learnt::default()),
    })
}

/// A push-pull's compressed `Buf` of `len` bytes, read through the window:
/// decoded and counted (`Inflate`); or, when the pool's joins know an
/// answer that begins like it (the same length, the same first window),
/// passed over and that one's count taken again, as long as all of it is
/// the same (CRC-32); or, when one is being decoded, read after it
/// ([`Memos`]). The embedded server shares one encoding between the joins
/// of 250 ms, so a storm's answers are mostly the same bytes: decoding each
/// again would cost the load box ~4.5 MB of LZW per join at 10,000
/// members. Which member reads it does not change the count but for the
/// member itself (listed or not: one at most). An answer that began alike
/// and ended otherwise keeps the count recalled (it differs by the members
/// that differ) and is forgotten: the next one is decoded.
async fn push_pull_buf<R: AsyncRead + Unpin>(
    w: &mut Window<'_, R>,
    len: usize,
    me: &str,
    memos: &Memos<Learnt>,
) -> Result<Learnt, WireError> {
    let head_len = len.min(WINDOW / 2);
    w.fill(head_len).await?;
    let key = Key {
        len,
        head: crc32fast::hash(&w.held()[..head_len]),
    };
    let mut crc = crc32fast::Hasher::new();
    loop {
        match memos.look(key) {
            Step::Wait(notify) => memos.wait(key, notify).await,
            Step::Decode(decoding) => {
                let mut inf = Inflate::new(me);
                w.pass(len, &mut |b| {
                    crc.update(b);
                    inf.feed(b)
                })
                .await?;
                let learnt = inf.learnt()?;
                decoding.done(crc.finalize(), learnt);
                return Ok(learnt);
            }
            Step::Recall { whole, learnt } => {
                w.pass(len, &mut |b| {
                    crc.update(b);
                    Ok(())
                })
                .await?;
                if crc.finalize() != whole {
                    memos.forget(key, whole);
                }
                return Ok(learnt);
            }
        }
    }
}

/// The header of a raw value (str, bin or nil): its data's length and the
/// header's.
fn bytes_header(b: &[u8]) -> Result<(usize, usize), WireError> {
    let (&m, rest) = b.split_first().ok_or(WireError::Truncated)?;
    let width = match m {
        0xa0..=0xbf => return Ok((usize::from(m & 0x1f), 1)),
        0xc0 => return Ok((0, 1)),
        0xc4 | 0xd9 => 1,
        0xc5 | 0xda => 2,
        0xc6 | 0xdb => 4,
        _ => return Err(WireError::Type("bytes", m)),
    };
    let len = rest.get(..width).ok_or(WireError::Truncated)?;
    let len = len.iter().fold(0, |v, b| v << 8 | usize::from(*b));
    Ok((len, 1 + width))
}

/// A stream read through a fixed buffer: bytes `at..end` of `buf` are read
/// and not yet used.
struct Window<'a, R> {
    conn: &'a mut R,
    buf: Box<[u8]>,
    at: usize,
    end: usize,
    count: &'a mut (dyn FnMut(usize) + Send),
}

impl<R: AsyncRead + Unpin> Window<'_, R> {
    /// The bytes read and not yet used.
    fn held(&self) -> &[u8] {
        &self.buf[self.at..self.end]
    }

    /// Uses `n` held bytes.
    fn consume(&mut self, n: usize) {
        self.at += n;
    }

    /// One more read (what is held moved to the front when the window's
    /// end is reached); a window full of one value is an oversized value.
    async fn more(&mut self) -> Result<(), WireError> {
        if self.at == self.end {
            (self.at, self.end) = (0, 0);
        }
        if self.end == self.buf.len() {
            if self.at == 0 {
                return Err(WireError::TooLarge(WINDOW));
            }
            self.buf.copy_within(self.at..self.end, 0);
            (self.end, self.at) = (self.end - self.at, 0);
        }
        let n = self
            .conn
            .read(&mut self.buf[self.end..])
            .await
            .map_err(|_| WireError::Truncated)?;
        if n == 0 {
            return Err(WireError::Truncated);
        }
        (self.count)(n);
        self.end += n;
        Ok(())
    }

    /// Reads until `n` bytes (at most the window) are held.
    async fn fill(&mut self, n: usize) -> Result<(), WireError> {
        while self.end - self.at < n {
            self.more().await?;
        }
        Ok(())
    }

    /// Reads one value with `f` (its value and the bytes it used) from what
    /// is held, reading more while it is cut short.
    async fn parse_with<T>(
        &mut self,
        mut f: impl FnMut(&[u8]) -> Result<(T, usize), WireError>,
    ) -> Result<T, WireError> {
        loop {
            match f(self.held()) {
                Ok((v, used)) => {
                    self.consume(used);
                    return Ok(v);
                }
                Err(WireError::Truncated) => self.more().await?,
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Window::parse_with`] a msgpack [`Reader`].
    async fn parse<T>(
        &mut self,
        mut f: impl FnMut(&mut Reader<'_>) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        self.parse_with(|b| {
            let mut r = Reader::new(b);
            let v = f(&mut r)?;
            Ok((v, r.position()))
        })
        .await
    }

    /// Skips `n` bytes, reading them through the window.
    async fn drain(&mut self, n: usize) -> Result<(), WireError> {
        self.pass(n, &mut |_| Ok(())).await
    }

    /// Moves the next `n` bytes into `out`, reading them through the window.
    async fn take_into(&mut self, out: &mut Vec<u8>, n: usize) -> Result<(), WireError> {
        self.pass(n, &mut |b| {
            out.extend_from_slice(b);
            Ok(())
        })
        .await
    }

    /// Uses the next `n` bytes, each piece as read given to `each`.
    async fn pass(
        &mut self,
        mut n: usize,
        each: &mut (dyn FnMut(&[u8]) -> Result<(), WireError> + Send),
    ) -> Result<(), WireError> {
        loop {
            let take = n.min(self.end - self.at);
            each(&self.held()[..take])?;
            self.consume(take);
            n -= take;
            if n == 0 {
                return Ok(());
            }
            self.more().await?;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use agent_sim_proto::msgpack::Writer;
    use tokio::io::ReadBuf;

    use super::*;
    use crate::wire::Keyring;
    use crate::wire::msgs::{NodeState, PushPull};

    const KEY: &str = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDwy7Cu5s=";

    /// A stream that gives at most `step` bytes a read.
    struct Trickle {
        data: Vec<u8>,
        at: usize,
        step: usize,
    }

    impl AsyncRead for Trickle {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            let n = self
                .step
                .min(buf.remaining())
                .min(self.data.len() - self.at);
            buf.put_slice(&self.data[self.at..self.at + n]);
            self.at += n;
            Poll::Ready(Ok(()))
        }
    }

    /// Reads `data` as member `me`'s join answer, `step` bytes a read: the
    /// reply with what it taught, and the bytes counted.
    async fn read_as(
        sec: &Security,
        me: &str,
        data: &[u8],
        step: usize,
    ) -> (Result<(Reply, Learnt), WireError>, usize) {
        let mut conn = Trickle {
            data: data.to_vec(),
            at: 0,
            step,
        };
        let mut counted = 0;
        let memos = Memos::<Learnt>::default();
        let reply = read_reply(sec, me, &mut conn, &mut |n| counted += n, &memos).await;
        (reply, counted)
    }

    /// [`read_as`] a member named in no answer, the reply alone.
    async fn read(sec: &Security, data: &[u8], step: usize) -> (Result<Reply, WireError>, usize) {
        let (reply, counted) = read_as(sec, "joiner", data, step).await;
        (reply.map(|(r, _)| r), counted)
    }

    fn keyed() -> Security {
        Security {
            label: "prod".into(),
            keyring: Some(Keyring::from_base64(&[KEY]).unwrap()),
        }
    }

    /// A push-pull of `n` members, `meta` bytes of meta each.
    fn push_pull(n: usize, meta: usize) -> Vec<u8> {
        let meta = vec![b'm'; meta];
        push_pull_of(n, |_| (&meta[..], state::ALIVE))
    }

    /// A push-pull of members `member-<i>`, each with the meta and state
    /// `of(i)` gives.
    fn push_pull_of<'m>(n: usize, of: impl Fn(usize) -> (&'m [u8], u8)) -> Vec<u8> {
        let names: Vec<String> = (0..n).map(|i| format!("member-{i}")).collect();
        let nodes = names.iter().enumerate().map(|(i, name)| NodeState {
            name,
            addr: &[10, 0, 0, 1],
            port: 8301,
            meta: of(i).0,
            state: of(i).1,
            ..Default::default()
        });
        let mut out = Vec::new();
        PushPull {
            join: false,
            nodes: nodes.collect(),
            user_state: &[2, 0x80],
        }
        .encode(&mut out);
        out
    }

    /// memberlist's error message.
    fn error(words: &str) -> Vec<u8> {
        let mut out = vec![kind::ERR];
        Writer(&mut out).map(1).kv_str("Error", words);
        out
    }

    #[tokio::test]
    async fn a_push_pull_is_read_to_its_end_in_every_framing_and_counted() {
        let msg = push_pull(2_000, 100);
        assert!(msg.len() > 10 * WINDOW);
        let plain = Security::default();
        let framings = [
            (plain.clone(), msg.clone()),
            (plain.clone(), plain.seal_stream(&msg)),
            (keyed(), keyed().seal_stream(&msg)),
        ];
        for (sec, wire) in framings {
            for step in [1, 7, 4096, usize::MAX] {
                let (reply, counted) = read(&sec, &wire, step).await;
                assert_eq!(reply, Ok(Reply::PushPull), "step {step}");
                assert_eq!(counted, wire.len(), "step {step}");
            }
        }
    }

    /// Reads `data` as member "joiner" with the pool's `memos`: what it taught.
    async fn taught(data: &[u8], memos: &Memos<Learnt>) -> u64 {
        let mut conn = Trickle {
            data: data.to_vec(),
            at: 0,
            step: 4096,
        };
        let sec = Security::default();
        let (_, learnt) = read_reply(&sec, "joiner", &mut conn, &mut |_| {}, memos)
            .await
            .unwrap();
        learnt.members
    }

    #[tokio::test]
    async fn a_shared_answer_is_decoded_once_and_recalled_while_it_is_the_same() {
        let plain = Security::default();
        let (a, b) = (
            plain.seal_stream(&push_pull(2_000, 100)),
            plain.seal_stream(&push_pull(1_999, 100)),
        );
        assert_eq!(a[0], kind::COMPRESS);
        let memos = Memos::<Learnt>::default();
        assert_eq!(taught(&a, &memos).await, 2_000);
        // Remembered: a forged count shows it is recalled, not decoded.
        memos.forge(|l| l.members == 2_000, 0, Learnt::of(7, 1, 200));
        assert_eq!(taught(&a, &memos).await, 7);
        // Another answer is decoded and remembered beside it.
        assert_eq!(taught(&b, &memos).await, 1_999);
        assert_eq!(taught(&a, &memos).await, 7, "the first still known");
        // One that began alike and ended otherwise: recalled, then
        // forgotten, so the next is decoded.
        memos.forge(|l| l.members == 1_999, 1, Learnt::of(8, 1, 200));
        assert_eq!(taught(&b, &memos).await, 8);
        assert_eq!(taught(&b, &memos).await, 1_999);
    }

    #[tokio::test]
    async fn the_servers_error_is_told_in_its_words_in_every_framing() {
        let msg = error("Too many pending push/pull requests");
        let plain = Security::default();
        for (sec, wire) in [
            (plain.clone(), msg.clone()),
            (plain.clone(), plain.seal_stream(&msg)),
            (keyed(), keyed().seal_stream(&msg)),
        ] {
            for step in [1, 4096] {
                let (reply, _) = read(&sec, &wire, step).await;
                let want = Reply::Error("Too many pending push/pull requests".into());
                assert_eq!(reply, Ok(want), "step {step}");
            }
        }
        let mut ping = vec![kind::PING];
        Writer(&mut ping).map(0);
        assert_eq!(read(&plain, &ping, 1).await.0, Ok(Reply::Other));
        assert_eq!(
            read(&plain, &plain.seal_stream(&ping), 1).await.0,
            Ok(Reply::Other)
        );
    }

    #[tokio::test]
    async fn an_answer_cut_short_anywhere_is_truncated() {
        let msg = push_pull(3, 10);
        let plain = Security::default();
        for (sec, wire) in [
            (plain.clone(), msg.clone()),
            (plain.clone(), plain.seal_stream(&msg)),
            (keyed(), keyed().seal_stream(&msg)),
        ] {
            for cut in 0..wire.len() {
                let (reply, counted) = read(&sec, &wire[..cut], 3).await;
                assert_eq!(reply, Err(WireError::Truncated), "cut at {cut}");
                assert_eq!(counted, cut);
            }
        }
    }

    #[tokio::test]
    async fn a_wrong_wrapping_or_an_oversized_part_is_refused_early() {
        let msg = push_pull(3, 10);
        let plain = Security::default();
        // Plain where the pool encrypts, encrypted where it does not.
        let (reply, counted) = read(&keyed(), &plain.seal_stream(&msg), 1).await;
        assert!(matches!(reply, Err(WireError::Crypt(_))), "{reply:?}");
        assert_eq!(counted, 1);
        let (reply, _) = read(&plain, &keyed().seal_stream(&msg), 1).await;
        assert!(matches!(reply, Err(WireError::Crypt(_))), "{reply:?}");
        // An encrypted frame claiming more than memberlist's limit.
        let mut head = vec![kind::ENCRYPT];
        head.extend_from_slice(&(MAX_STATE_BYTES as u32 + 1).to_be_bytes());
        let (reply, _) = read(&keyed(), &head, 1).await;
        assert_eq!(reply, Err(WireError::TooLarge(MAX_STATE_BYTES)));
        // A node state larger than the window.
        let (reply, counted) = read(&plain, &push_pull(1, WINDOW), 4096).await;
        assert_eq!(reply, Err(WireError::TooLarge(WINDOW)));
        assert!(counted < WINDOW + 64, "{counted}");
        // What the first byte is checked by: no frame is whole in one byte.
        for b in 0..=u8::MAX {
            for sec in [plain.clone(), keyed()] {
                assert!(!matches!(sec.open_stream_frame(&[b]), Ok(Some(_))), "{b}");
            }
        }
        // An unknown message type.
        assert_eq!(
            read(&plain, &[0x42, 0], 1).await.0,
            Err(WireError::Unknown(0x42))
        );
    }

    #[tokio::test]
    async fn the_alive_members_listed_and_the_servers_among_them_are_counted_in_every_framing() {
        // 300 members (far more than a window): every 10th a server, every
        // 7th not alive, member-5 the joiner itself.
        let server = crate::serf::encode_tags(&[("role", "consul"), ("dc", "dc1")]);
        let client = crate::serf::encode_tags(&[("role", "node"), ("dc", "dc1")]);
        let msg = push_pull_of(300, |i| {
            let meta = if i % 10 == 0 { &server } else { &client };
            let gone = [state::SUSPECT, state::DEAD, state::LEFT][i % 3];
            let st = if i % 7 == 3 { gone } else { state::ALIVE };
            (&meta[..], st)
        });
        let alive = |i: &usize| i % 7 != 3 && *i != 5;
        let members = (0..300).filter(alive).count() as u64;
        let servers = (0..300).filter(|i| alive(i) && i % 10 == 0).count() as u64;
        let plain = Security::default();
        for (sec, wire) in [
            (plain.clone(), msg.clone()),
            (plain.clone(), plain.seal_stream(&msg)),
            (keyed(), keyed().seal_stream(&msg)),
        ] {
            for step in [1, 977, usize::MAX] {
                let (reply, counted) = read_as(&sec, "member-5", &wire, step).await;
                let (reply, learnt) = reply.unwrap();
                assert_eq!(reply, Reply::PushPull);
                assert_eq!(counted, wire.len(), "step {step}");
                assert_eq!((learnt.members, learnt.servers), (members, servers));
                // A sample's mean: between a client's alive and a server's.
                let len = learnt.alive_len().unwrap();
                assert!((50..90).contains(&len), "{len}");
            }
        }
        assert_eq!(Learnt::default().alive_len(), None);
        assert!(is_server(b"consul") && !is_server(b"node") && !is_server(&client));
    }

    #[tokio::test]
    async fn a_compressed_answer_that_ends_before_its_members_is_truncated() {
        // A header promising 10 nodes, 2 given; compressed whole.
        let two = push_pull(2, 10);
        let mut msg = Vec::new();
        PushPullHeader {
            nodes: 10,
            user_state_len: 0,
            join: false,
        }
        .encode(&mut msg);
        for n in &PushPull::decode(&two[1..]).unwrap().nodes {
            n.encode(&mut msg);
        }
        let plain = Security::default();
        let (reply, _) = read(&plain, &plain.seal_stream(&msg), 64).await;
        assert_eq!(reply, Err(WireError::Truncated));
    }
}
