//! memberlist's compression: LZW as Go's `compress/lzw` writes it with
//! least-significant-bit-first packing and 8-bit literals (GIF's variant):
//! codes start 9 bits wide after a clear code (256), widen as the table
//! fills, a full table (4,095 codes) is followed by a clear code, and the
//! stream ends with code 257 and the remaining bits padded to a byte.
//!
//! The decoder stops at a caller's limit of output bytes: a small packet
//! cannot make it allocate more than that (LZW expands ~2,000-fold at most).
//! [`Decoder`] takes a stream a piece at a time, for what is read as it
//! arrives.

use super::WireError;

const CLEAR: u16 = 256;
const EOF: u16 = 257;
const MAX_WIDTH: u32 = 12;
/// Codes are below this.
const MAX_CODE: u16 = (1 << MAX_WIDTH) - 1;
const TABLE: usize = 1 << 14;
const EMPTY: u32 = u32::MAX;

/// Packs codes of varying width, low bits first.
struct Bits {
    out: Vec<u8>,
    acc: u64,
    n: u32,
}

impl Bits {
    fn put(&mut self, code: u16, width: u32) {
        self.acc |= u64::from(code) << self.n;
        self.n += width;
        while self.n >= 8 {
            self.out.push(self.acc as u8);
            self.acc >>= 8;
            self.n -= 8;
        }
    }
}

/// The encoder's string table: (prefix code, next byte) -> code, open
/// addressing over a fixed array (a table never holds more than 3,838
/// strings, so it never fills).
struct Strings {
    slots: Vec<u32>,
}

impl Strings {
    fn key(prefix: u16, byte: u8) -> u32 {
        u32::from(prefix) << 8 | u32::from(byte)
    }

    fn slot(key: u32) -> usize {
        ((key >> 12 ^ key) as usize) & (TABLE - 1)
    }

    fn get(&self, key: u32) -> Option<u16> {
        let mut i = Self::slot(key);
        loop {
            let e = self.slots[i];
            if e == EMPTY {
                return None;
            }
            if e >> 12 == key {
                return Some((e & 0xfff) as u16);
            }
            i = (i + 1) & (TABLE - 1);
        }
    }

    fn insert(&mut self, key: u32, code: u16) {
        let mut i = Self::slot(key);
        while self.slots[i] != EMPTY {
            i = (i + 1) & (TABLE - 1);
        }
        self.slots[i] = key << 12 | u32::from(code);
    }

    fn clear(&mut self) {
        self.slots.fill(EMPTY);
    }
}

/// The encoder's code counter: the last code assigned and the width the
/// next code is written with.
struct Codes {
    hi: u16,
    width: u32,
}

impl Codes {
    fn reset(&mut self) {
        self.hi = EOF;
        self.width = 9;
    }

    /// Takes the next code; `false` when the table was full and has been
    /// cleared (a clear code was written).
    fn next(&mut self, bits: &mut Bits) -> bool {
        self.hi += 1;
        if u32::from(self.hi) == 1 << self.width {
            self.width += 1;
        }
        if self.hi == MAX_CODE {
            bits.put(CLEAR, self.width);
            self.reset();
            return false;
        }
        true
    }
}

/// Compresses `input` as Go's `lzw.NewWriter(w, lzw.LSB, 8)` does, byte for
/// byte.
pub fn compress(input: &[u8]) -> Vec<u8> {
    let mut bits = Bits {
        out: Vec::with_capacity(input.len() / 2 + 8),
        acc: 0,
        n: 0,
    };
    let mut codes = Codes { hi: EOF, width: 9 };
    let Some((&first, rest)) = input.split_first() else {
        bits.put(CLEAR, 9);
        bits.put(EOF, 9);
        return finish(bits);
    };
    let mut strings = Strings {
        slots: vec![EMPTY; TABLE],
    };
    bits.put(CLEAR, codes.width);
    let mut code = u16::from(first);
    for &b in rest {
        let key = Strings::key(code, b);
        if let Some(c) = strings.get(key) {
            code = c;
            continue;
        }
        bits.put(code, codes.width);
        code = u16::from(b);
        if codes.next(&mut bits) {
            strings.insert(key, codes.hi);
        } else {
            strings.clear();
        }
    }
    bits.put(code, codes.width);
    codes.next(&mut bits);
    bits.put(EOF, codes.width);
    finish(bits)
}

fn finish(mut bits: Bits) -> Vec<u8> {
    if bits.n > 0 {
        bits.out.push(bits.acc as u8);
    }
    bits.out
}

/// Decompresses a Go LZW (LSB, 8-bit) stream, refusing more than `limit`
/// bytes of output. A stream that ends without its end code is accepted
/// up to where it stops (Go's reader reports it after returning the data;
/// a truncated compressed message then fails its own decoding).
pub fn decompress(input: &[u8], limit: usize) -> Result<Vec<u8>, WireError> {
    decompress_upto(input, limit, usize::MAX)
}

/// The first `n` bytes of a stream's output (fewer if it holds fewer),
/// without decompressing the rest: a message's type, cheaply.
pub fn decompress_prefix(input: &[u8], n: usize) -> Result<Vec<u8>, WireError> {
    decompress_upto(input, usize::MAX, n)
}

fn decompress_upto(input: &[u8], limit: usize, stop: usize) -> Result<Vec<u8>, WireError> {
    let mut out: Vec<u8> = Vec::with_capacity((input.len() * 3).min(limit).min(stop));
    Decoder::new().feed(input, &mut out, stop.min(limit.saturating_add(1)))?;
    if out.len() > limit {
        return Err(WireError::TooLarge(limit));
    }
    out.truncate(stop);
    Ok(out)
}

/// A decoder fed a stream a piece at a time, for a compressed message read
/// as it arrives (a join's answer): its code table and the bits of a code
/// cut between two pieces are its whole state (12 KiB).
pub struct Decoder {
    /// `prefix[c]`, `suffix[c]`: the string of code c is prefix's string
    /// then suffix.
    prefix: [u16; 1 << MAX_WIDTH],
    suffix: [u8; 1 << MAX_WIDTH],
    width: u32,
    hi: u16,
    last: Option<u16>,
    acc: u64,
    n: u32,
    /// One code's string, last byte first while it is expanded.
    scratch: Vec<u8>,
    ended: bool,
}

impl Default for Decoder {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder {
    /// A decoder at a stream's start.
    pub fn new() -> Decoder {
        Decoder {
            prefix: [0; 1 << MAX_WIDTH],
            suffix: [0; 1 << MAX_WIDTH],
            width: 9,
            hi: EOF,
            last: None,
            acc: 0,
            n: 0,
            scratch: Vec::with_capacity(64),
            ended: false,
        }
    }

    /// Whether the stream's end code was read (what follows it is not
    /// decoded).
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Decodes `input` onto `out` until `input` is used up, the end code,
    /// or `out` holds at least `until` bytes (then up to one code's string,
    /// at most 4,096 bytes, more); returns the bytes of `input` used. A
    /// code cut at the end of `input` is finished by the next piece.
    pub fn feed(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
        until: usize,
    ) -> Result<usize, WireError> {
        let mut at = 0;
        while !self.ended && out.len() < until {
            while self.n < self.width {
                let Some(&b) = input.get(at) else {
                    return Ok(at);
                };
                self.acc |= u64::from(b) << self.n;
                self.n += 8;
                at += 1;
            }
            let code = (self.acc & ((1 << self.width) - 1)) as u16;
            self.acc >>= self.width;
            self.n -= self.width;
            self.code(code, out)?;
        }
        Ok(at)
    }

    /// One code: a clear, the end, or a string appended to `out`.
    fn code(&mut self, code: u16, out: &mut Vec<u8>) -> Result<(), WireError> {
        if code == CLEAR {
            (self.width, self.hi, self.last) = (9, EOF, None);
            return Ok(());
        }
        if code == EOF {
            self.ended = true;
            return Ok(());
        }
        if code > self.hi || (code == self.hi && self.last.is_none()) {
            return Err(WireError::Lzw);
        }
        // Expand `code` (or, for the code being defined, the last string
        // plus its own first byte) into scratch, last byte first.
        self.scratch.clear();
        let mut c = if code == self.hi {
            self.last.unwrap_or(0)
        } else {
            code
        };
        while c > CLEAR {
            self.scratch.push(self.suffix[usize::from(c)]);
            c = self.prefix[usize::from(c)];
        }
        let head = c as u8;
        self.scratch.push(head);
        self.scratch.reverse();
        if code == self.hi {
            self.scratch.push(head);
        }
        out.extend_from_slice(&self.scratch);
        if let Some(l) = self.last {
            self.suffix[usize::from(self.hi)] = head;
            self.prefix[usize::from(self.hi)] = l;
        }
        self.last = Some(code);
        self.hi += 1;
        if u32::from(self.hi) >= 1 << self.width {
            if self.width == MAX_WIDTH {
                self.last = None;
                self.hi -= 1;
            } else {
                self.width += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn an_empty_input_is_a_clear_and_an_end() {
        // 256 then 257, 9 bits each, low bits first.
        assert_eq!(compress(b""), vec![0x00, 0x03, 0x02]);
        assert_eq!(decompress(&compress(b""), 10).unwrap(), b"");
    }

    #[test]
    fn bytes_go_wrote_read_back() {
        // Go 1.22: lzw.NewWriter(&b, lzw.LSB, 8) of "TOBEORNOTTOBEORTOBEORNOT".
        let go = [
            0x00, 0xa9, 0x3c, 0x11, 0x52, 0xe4, 0x89, 0x14, 0x27, 0x4f, 0xa8, 0x08, 0x24, 0x68,
            0x70, 0x61, 0xc1, 0x83, 0x09, 0x03, 0x02,
        ];
        let text = b"TOBEORNOTTOBEORTOBEORNOT";
        assert_eq!(decompress(&go, 100).unwrap(), text);
        assert_eq!(compress(text), go);
    }

    /// The inputs of `lcg_text_go_agrees`, made the same way in Go.
    fn lcg(n: usize, alphabet: bool, x: &mut u32) -> Vec<u8> {
        (0..n)
            .map(|_| {
                *x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                if alphabet {
                    b"abcdefghijklmnop"[((*x >> 16) & 15) as usize]
                } else {
                    (*x >> 16) as u8
                }
            })
            .collect()
    }

    #[test]
    fn long_inputs_match_go_through_widening_and_clears() {
        // Go 1.22 wrote (length, crc32) for these: 200,000 bytes over 16
        // letters fill the table dozens of times; 70,000 random bytes
        // compress to more than they were.
        let mut x = 12_345;
        let a = lcg(200_000, true, &mut x);
        let b = lcg(70_000, false, &mut x);
        for (input, len, crc) in [(a, 125_340, 275_976_117), (b, 95_834, 1_840_017_890)] {
            let z = compress(&input);
            assert_eq!((z.len(), crc32fast::hash(&z)), (len, crc));
            assert_eq!(decompress(&z, 1 << 20).unwrap(), input);
        }
    }

    #[test]
    fn a_prefix_is_the_start_of_the_whole() {
        let mut x = 7;
        let text = lcg(50_000, true, &mut x);
        let z = compress(&text);
        for n in [0, 1, 5, 4_000] {
            assert_eq!(decompress_prefix(&z, n).unwrap(), &text[..n]);
        }
        assert_eq!(decompress_prefix(&z, 1 << 20).unwrap(), text);
    }

    #[test]
    fn a_stream_fed_in_pieces_decodes_as_the_whole() {
        let mut x = 11;
        let text = lcg(60_000, true, &mut x);
        let z = compress(&text);
        for piece in [1, 3, 1000] {
            let (mut d, mut out) = (Decoder::new(), Vec::new());
            for chunk in z.chunks(piece) {
                // A small `until` makes each piece decode in several calls.
                let mut at = 0;
                while at < chunk.len() && !d.ended() {
                    let until = out.len() + 100;
                    at += d.feed(&chunk[at..], &mut out, until).unwrap();
                }
            }
            assert!(d.ended());
            assert_eq!(out, text, "pieces of {piece}");
        }
    }

    #[test]
    fn output_past_the_limit_is_refused() {
        let big = vec![b'a'; 100_000];
        let z = compress(&big);
        assert!(z.len() < 2_000);
        assert_eq!(decompress(&z, 50_000), Err(WireError::TooLarge(50_000)));
        assert_eq!(decompress(&z, 100_000).unwrap(), big);
    }

    #[test]
    fn a_code_not_yet_defined_is_an_error() {
        // clear, then code 300 (undefined) at 9 bits.
        let mut b = Bits {
            out: Vec::new(),
            acc: 0,
            n: 0,
        };
        b.put(CLEAR, 9);
        b.put(300, 9);
        assert_eq!(decompress(&finish(b), 100), Err(WireError::Lzw));
    }

    proptest! {
        #[test]
        fn anything_compressed_decompresses_to_itself(
            data in proptest::collection::vec(prop_oneof![Just(b'a'), Just(b'b'), any::<u8>()], 0..20_000)
        ) {
            prop_assert_eq!(decompress(&compress(&data), 1 << 20).unwrap(), data);
        }

        #[test]
        fn any_bytes_decode_to_an_answer_without_panicking(data in proptest::collection::vec(any::<u8>(), 0..2_000)) {
            let _ = decompress(&data, 1 << 16);
        }
    }
}
