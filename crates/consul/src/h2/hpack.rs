//! HPACK (RFC 7541) as the agent's HTTP/2 client needs it: a decoder of
//! the server's header blocks (static and dynamic table, integers,
//! Huffman-coded strings) and the request's block, written without
//! indexing and without Huffman (a Subscribe call sends one block per
//! stream, so compression would save a few dozen bytes a session).
//!
//! The client announces a dynamic table of 0 octets, so a server's encoder
//! keeps no entries for it; the decoder still follows whatever size the
//! encoder sets, up to HTTP/2's default of 4,096, because a server may
//! encode before it has read the client's settings.

use std::collections::VecDeque;

use super::huffman;

/// The dynamic table size a decoder accepts before any update: HTTP/2's
/// default `SETTINGS_HEADER_TABLE_SIZE`.
pub const DEFAULT_TABLE: usize = 4096;

/// Why a header block could not be decoded (a connection error: the
/// decoder's state is lost with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    /// The block ended inside a representation.
    #[error("HPACK: the header block ends inside a field")]
    Truncated,
    /// An integer over 2^32.
    #[error("HPACK: an integer overflows")]
    Overflow,
    /// An index past the static and dynamic tables.
    #[error("HPACK: index {0} is in neither table")]
    Index(u32),
    /// A Huffman string with bad padding or an EOS symbol.
    #[error("HPACK: a Huffman-coded string is malformed")]
    Huffman,
    /// A dynamic table size update over the limit.
    #[error("HPACK: the encoder set a table of {0} octets, over the limit")]
    TableSize(u32),
}

/// RFC 7541 Appendix A: the static table, entries 1 to 61.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// Octets an entry counts for in a table: its name, its value and 32.
fn entry_size(name: &[u8], value: &[u8]) -> usize {
    name.len() + value.len() + 32
}

/// A dynamic table entry: name, value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The decoding side of one connection.
#[derive(Debug)]
pub struct Decoder {
    /// Newest first.
    table: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Default for Decoder {
    fn default() -> Self {
        Decoder {
            table: VecDeque::new(),
            size: 0,
            max: DEFAULT_TABLE,
        }
    }
}

/// Reads the integer of a representation whose first octet keeps `prefix`
/// bits for it (RFC 7541 5.1); advances `at`.
fn integer(b: &[u8], at: &mut usize, prefix: u32) -> Result<u32, HpackError> {
    let mask = (1u32 << prefix) - 1;
    let first = u32::from(*b.get(*at).ok_or(HpackError::Truncated)?) & mask;
    *at += 1;
    if first < mask {
        return Ok(first);
    }
    let mut v = u64::from(mask);
    let mut shift = 0;
    loop {
        let byte = *b.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        v += u64::from(byte & 0x7f) << shift;
        if v > u64::from(u32::MAX) {
            return Err(HpackError::Overflow);
        }
        if byte & 0x80 == 0 {
            return Ok(v as u32);
        }
        shift += 7;
    }
}

/// Appends the integer `v` with `prefix` bits in the first octet, whose
/// other bits are `flags`.
pub fn put_integer(out: &mut Vec<u8>, flags: u8, prefix: u32, v: usize) {
    let mask = (1usize << prefix) - 1;
    if v < mask {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = v - mask;
    while rest >= 0x80 {
        out.push((rest & 0x7f) as u8 | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// Reads a string literal into `out` (decoding Huffman); advances `at`.
fn string(b: &[u8], at: &mut usize, out: &mut Vec<u8>) -> Result<(), HpackError> {
    let huff = *b.get(*at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = integer(b, at, 7)? as usize;
    let raw = b.get(*at..*at + len).ok_or(HpackError::Truncated)?;
    *at += len;
    if huff {
        huffman::decode(raw, out).map_err(|_| HpackError::Huffman)
    } else {
        out.extend_from_slice(raw);
        Ok(())
    }
}

impl Decoder {
    /// The entry at `index` (1-based over the static, then the dynamic
    /// table), appended to `name` and `value`.
    fn get(&self, index: u32, name: &mut Vec<u8>, value: &mut Vec<u8>) -> Result<(), HpackError> {
        let i = index as usize;
        if (1..=STATIC.len()).contains(&i) {
            let (n, v) = STATIC[i - 1];
            name.extend_from_slice(n.as_bytes());
            value.extend_from_slice(v.as_bytes());
            return Ok(());
        }
        let (n, v) = self
            .table
            .get(i.wrapping_sub(STATIC.len() + 1))
            .ok_or(HpackError::Index(index))?;
        name.extend_from_slice(n);
        value.extend_from_slice(v);
        Ok(())
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            let Some((n, v)) = self.table.pop_back() else {
                break;
            };
            self.size -= entry_size(&n, &v);
        }
        if self.table.is_empty() {
            // An empty table keeps no allocation.
            self.table = VecDeque::new();
        }
    }

    fn insert(&mut self, name: &[u8], value: &[u8]) {
        let size = entry_size(name, value);
        self.evict_to(self.max.saturating_sub(size));
        // An entry larger than the table empties it and is not kept.
        if size <= self.max {
            self.table.push_front((name.into(), value.into()));
            self.size += size;
        }
    }

    /// Decodes one header block, calling `field` with each name and value
    /// in order.
    pub fn decode(
        &mut self,
        block: &[u8],
        mut field: impl FnMut(&[u8], &[u8]),
    ) -> Result<(), HpackError> {
        let (mut name, mut value) = (Vec::new(), Vec::new());
        let mut at = 0;
        while at < block.len() {
            name.clear();
            value.clear();
            let first = block[at];
            if first & 0x80 != 0 {
                // Indexed field.
                let index = integer(block, &mut at, 7)?;
                self.get(index, &mut name, &mut value)?;
                field(&name, &value);
                continue;
            }
            if first & 0xe0 == 0x20 {
                // Dynamic table size update.
                let size = integer(block, &mut at, 5)?;
                if size as usize > DEFAULT_TABLE {
                    return Err(HpackError::TableSize(size));
                }
                self.max = size as usize;
                self.evict_to(self.max);
                continue;
            }
            // A literal: with incremental indexing (01), else without or
            // never indexed (0000, 0001).
            let indexing = first & 0xc0 == 0x40;
            let index = integer(block, &mut at, if indexing { 6 } else { 4 })?;
            if index == 0 {
                string(block, &mut at, &mut name)?;
            } else {
                self.get(index, &mut name, &mut Vec::new())?;
            }
            string(block, &mut at, &mut value)?;
            if indexing {
                self.insert(&name, &value);
            }
            field(&name, &value);
        }
        Ok(())
    }

    /// Octets held in the dynamic table.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.size
    }
}

/// Appends a field without indexing: the name by its static index when it
/// has one (`name_index` > 0), else literally, and the value literally.
pub fn put_field(out: &mut Vec<u8>, name_index: usize, name: &str, value: &str) {
    put_integer(out, 0x00, 4, name_index);
    if name_index == 0 {
        put_integer(out, 0x00, 7, name.len());
        out.extend_from_slice(name.as_bytes());
    }
    put_integer(out, 0x00, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

/// Appends a field that is whole in the static table.
pub fn put_indexed(out: &mut Vec<u8>, index: usize) {
    put_integer(out, 0x80, 7, index);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(d: &mut Decoder, block: &[u8]) -> Vec<(String, String)> {
        let mut v = Vec::new();
        d.decode(block, |n, val| {
            v.push((
                String::from_utf8_lossy(n).into_owned(),
                String::from_utf8_lossy(val).into_owned(),
            ))
        })
        .unwrap();
        v
    }

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn the_rfc_responses_with_huffman_decode_and_evict() {
        // RFC 7541 C.6: three responses, a 256-octet table, Huffman coding.
        let mut d = Decoder::default();
        d.decode(&[0x3f, 0xe1, 0x01], |_, _| {}).unwrap(); // size update to 256
        let first = hex(
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        );
        assert_eq!(
            fields(&mut d, &first),
            pairs(&[
                (":status", "302"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.held(), 222);
        let second = hex("4883 640e ffc1 c0bf");
        assert_eq!(
            fields(&mut d, &second),
            pairs(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com"),
            ])
        );
        assert_eq!(d.held(), 222);
        let third = hex(
            "88c1 6196 d07a be94 1054 d444 a820 0595 040b 8166 e084 a62d 1bff c05a 839b d9ab
             77ad 94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f
             9587 3160 65c0 03ed 4ee5 b106 3d50 07",
        );
        assert_eq!(
            fields(&mut d, &third),
            pairs(&[
                (":status", "200"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:22 GMT"),
                ("location", "https://www.example.com"),
                ("content-encoding", "gzip"),
                (
                    "set-cookie",
                    "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1"
                ),
            ])
        );
        assert_eq!(d.held(), 215);
    }

    #[test]
    fn integers_round_trip_at_their_prefix() {
        for (prefix, v) in [(5, 10usize), (5, 1337), (7, 127), (4, 15), (6, 1 << 20)] {
            let mut out = Vec::new();
            put_integer(&mut out, 0, prefix, v);
            let mut at = 0;
            assert_eq!(integer(&out, &mut at, prefix).unwrap() as usize, v);
            assert_eq!(at, out.len());
        }
        // RFC 7541 C.1.2: 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        put_integer(&mut out, 0, 5, 1337);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        let mut at = 0;
        let huge = [0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f];
        assert_eq!(integer(&huge, &mut at, 5), Err(HpackError::Overflow));
    }

    #[test]
    fn hostile_blocks_are_errors_not_panics() {
        let mut d = Decoder::default();
        assert_eq!(d.decode(&[0xbe], |_, _| {}), Err(HpackError::Index(62)));
        assert_eq!(d.decode(&[0x80], |_, _| {}), Err(HpackError::Index(0)));
        assert_eq!(
            d.decode(&[0x04, 0x05, b'a'], |_, _| {}),
            Err(HpackError::Truncated)
        );
        assert_eq!(
            d.decode(&[0x3f, 0xe2, 0x1f], |_, _| {}),
            Err(HpackError::TableSize(4097))
        );
    }

    #[test]
    fn a_zero_table_keeps_nothing() {
        let mut d = Decoder::default();
        // Size update to 0, then a literal with incremental indexing.
        let mut block = vec![0x20, 0x40];
        put_integer(&mut block, 0, 7, 4);
        block.extend_from_slice(b"name");
        put_integer(&mut block, 0, 7, 5);
        block.extend_from_slice(b"value");
        assert_eq!(fields(&mut d, &block), pairs(&[("name", "value")]));
        assert_eq!(d.held(), 0);
        assert_eq!(d.table.capacity(), 0);
    }

    #[test]
    fn the_request_fields_read_back() {
        let mut out = Vec::new();
        put_indexed(&mut out, 3);
        put_field(
            &mut out,
            4,
            ":path",
            "/subscribe.StateChangeSubscription/Subscribe",
        );
        put_field(&mut out, 0, "te", "trailers");
        assert_eq!(
            fields(&mut Decoder::default(), &out),
            pairs(&[
                (":method", "POST"),
                (":path", "/subscribe.StateChangeSubscription/Subscribe"),
                ("te", "trailers"),
            ])
        );
    }
}
