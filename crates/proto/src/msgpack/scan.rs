//! Where a msgpack value ends in a byte stream: the framing of Consul's
//! net/rpc over yamux (a request or an answer is two values back to back,
//! with no length in front). No decoding: only markers and lengths are read.

/// A malformed msgpack message: where a value could not be walked
/// ([`Scanner`]), or a whole value that did not decode as its caller's
/// type ([`MsgpackError::decode`]).
#[derive(Debug, thiserror::Error)]
pub enum MsgpackError {
    /// The marker 0xc1, which msgpack reserves: no value starts with it.
    #[error("msgpack: reserved marker 0xc1 at byte {at}")]
    ReservedMarker {
        /// Where the marker is.
        at: usize,
    },
    /// Containers nested deeper than [`MAX_DEPTH`].
    #[error("msgpack: nested deeper than {MAX_DEPTH}")]
    TooDeep,
    /// A length field larger than `usize` (a 32-bit machine).
    #[error("msgpack: a length past what this machine addresses")]
    LengthPastAddress,
    /// A value (an answer's header or body) that did not decode as the type
    /// its reader expects.
    #[error("msgpack: {part}: {source}")]
    Decode {
        /// What was read (`response header`, `Session.Apply`, ...).
        part: &'static str,
        /// The decoder's error (`rmp_serde`'s, in the protocol crates).
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl MsgpackError {
    /// A value read as `part` that did not decode.
    pub fn decode(
        part: &'static str,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        MsgpackError::Decode {
            part,
            source: source.into(),
        }
    }

    /// The error kind an agent counts it as (declared, with its hint, in
    /// the consul crate's kinds).
    pub fn kind(&self) -> &'static str {
        match self {
            MsgpackError::ReservedMarker { .. } => "decode_answer",
            MsgpackError::TooDeep => "decode_answer",
            MsgpackError::LengthPastAddress => "decode_answer",
            MsgpackError::Decode { .. } => "decode_answer",
        }
    }
}

/// Most nesting a value may have (Consul's answers nest 6 deep).
pub const MAX_DEPTH: usize = 64;

/// The length of the msgpack value at the start of `buf`: `Ok(None)` when
/// `buf` holds only part of it.
pub fn value_len(buf: &[u8]) -> Result<Option<usize>, MsgpackError> {
    Scanner::default().scan(buf)
}

/// Finds where one msgpack value ends in a buffer that grows (a message
/// read in chunks): each [`Scanner::scan`] resumes where the last one
/// stopped, so a 7 MB answer is walked once, not once per chunk.
#[derive(Debug, Clone)]
pub struct Scanner {
    /// Values still to skip, by nesting level (a map entry is two).
    pending: Vec<u64>,
    /// Where the next element starts.
    at: usize,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner {
            pending: vec![1],
            at: 0,
        }
    }
}

/// Where one net/rpc message ends in a growing buffer: a header value,
/// then a body value, back to back (a request or an answer alike).
#[derive(Debug, Clone, Default)]
pub struct MessageScan {
    head: Scanner,
    body: Scanner,
    header_end: Option<usize>,
}

impl MessageScan {
    /// `(header_end, end)` once `buf` (the same bytes as before, perhaps
    /// more) holds the whole message.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<(usize, usize)>, MsgpackError> {
        let h = match self.header_end {
            Some(h) => h,
            None => match self.head.scan(buf)? {
                Some(h) => {
                    self.header_end = Some(h);
                    h
                }
                None => return Ok(None),
            },
        };
        Ok(self.body.scan(&buf[h..])?.map(|b| (h, h + b)))
    }
}

impl Scanner {
    /// The value's length once `buf` (the same bytes as before, perhaps
    /// more) holds all of it.
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, MsgpackError> {
        while let Some(left) = self.pending.last_mut() {
            if *left == 0 {
                self.pending.pop();
                continue;
            }
            let Some((end, container)) = element(buf, self.at)? else {
                return Ok(None);
            };
            *left -= 1;
            self.at = end;
            if let Some(n) = container.filter(|n| *n > 0) {
                if self.pending.len() >= MAX_DEPTH {
                    return Err(MsgpackError::TooDeep);
                }
                self.pending.push(n);
            }
        }
        Ok(Some(self.at))
    }
}

/// One element at `at`: where it ends (its marker, length and payload; a
/// container's items follow it) and how many items a container holds.
fn element(buf: &[u8], at: usize) -> Result<Option<(usize, Option<u64>)>, MsgpackError> {
    let need = |at: usize, n: usize| at.checked_add(n).filter(|e| *e <= buf.len());
    let be = |b: &[u8]| b.iter().fold(0u64, |a, x| (a << 8) | u64::from(*x));
    let Some(&m) = buf.get(at) else {
        return Ok(None);
    };
    let mut at = at + 1;
    // (bytes of a length field, what the length counts)
    let (fixed, container): (u64, Option<u64>) = match m {
        0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => (0, None),
        0x80..=0x8f => (0, Some(u64::from(m & 0x0f) * 2)),
        0x90..=0x9f => (0, Some(u64::from(m & 0x0f))),
        0xa0..=0xbf => (u64::from(m & 0x1f), None),
        0xcc | 0xd0 => (1, None),
        0xcd | 0xd1 => (2, None),
        0xca | 0xce | 0xd2 => (4, None),
        0xcb | 0xcf | 0xd3 => (8, None),
        0xd4 => (2, None),
        0xd5 => (3, None),
        0xd6 => (5, None),
        0xd7 => (9, None),
        0xd8 => (17, None),
        0xc4 | 0xd9 | 0xc5 | 0xda | 0xc6 | 0xdb | 0xc7 | 0xc8 | 0xc9 => {
            let w = match m {
                0xc4 | 0xd9 | 0xc7 => 1,
                0xc5 | 0xda | 0xc8 => 2,
                _ => 4,
            };
            let Some(end) = need(at, w) else {
                return Ok(None);
            };
            let mut n = be(&buf[at..end]);
            at = end;
            if matches!(m, 0xc7..=0xc9) {
                n += 1; // the ext type byte
            }
            (n, None)
        }
        0xdc..=0xdf => {
            let w = if matches!(m, 0xdc | 0xde) { 2 } else { 4 };
            let Some(end) = need(at, w) else {
                return Ok(None);
            };
            let n = be(&buf[at..end]);
            at = end;
            (0, Some(if m >= 0xde { n * 2 } else { n }))
        }
        0xc1 => {
            return Err(MsgpackError::ReservedMarker { at: at - 1 });
        }
    };
    match usize::try_from(fixed).ok().map(|f| need(at, f)) {
        Some(Some(end)) => Ok(Some((end, container))),
        Some(None) => Ok(None),
        None => Err(MsgpackError::LengthPastAddress),
    }
}
