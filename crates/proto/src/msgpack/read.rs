//! Reading msgpack by hand from a byte slice, one value at a time, borrowing
//! strings and bytes: what memberlist and serf write (Go's old-spec codec:
//! strings and `[]byte` both as raw, structs as maps of field names), read
//! field by field where a serde type would copy or allocate per packet.
//!
//! Every length is checked against what is left of the input before use, so
//! a hostile packet costs at most its own size.

use std::marker::PhantomData;

/// A value that could not be read (the gossip crate counts each as a cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// The input ends before its values do.
    #[error("truncated message")]
    Truncated,
    /// A value is not of the type its field needs: what was wanted, and
    /// the marker found.
    #[error("expected {0}, found marker {1:#04x}")]
    Type(&'static str, u8),
    /// A number does not fit its field.
    #[error("number out of range")]
    Range,
    /// A string is not UTF-8.
    #[error("string is not UTF-8")]
    Utf8,
    /// Values nested deeper than [`READ_MAX_DEPTH`].
    #[error("nested too deep")]
    TooDeep,
}

/// Most nesting a skipped value may have (memberlist's deepest message,
/// serf's push-pull with events, nests 4).
pub const READ_MAX_DEPTH: usize = 16;
const MAX_DEPTH: usize = READ_MAX_DEPTH;

/// A cursor over one message's bytes; its reads fail with `E` (a caller's
/// own error that a [`ReadError`] converts into, so a field's reader can
/// mix both).
#[derive(Debug, Clone)]
pub struct Reader<'a, E = ReadError> {
    buf: &'a [u8],
    at: usize,
    err: PhantomData<fn() -> E>,
}

impl<'a, E: From<ReadError>> Reader<'a, E> {
    /// Starts at the first byte of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader {
            buf,
            at: 0,
            err: PhantomData,
        }
    }

    /// Bytes consumed so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// What is left after the values read so far.
    pub fn rest(&self) -> &'a [u8] {
        &self.buf[self.at..]
    }

    fn byte(&mut self) -> Result<u8, E> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or_else(|| E::from(ReadError::Truncated))?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], E> {
        let end = self
            .at
            .checked_add(n)
            .ok_or_else(|| E::from(ReadError::Truncated))?;
        let s = self
            .buf
            .get(self.at..end)
            .ok_or_else(|| E::from(ReadError::Truncated))?;
        self.at = end;
        Ok(s)
    }

    fn be(&mut self, n: usize) -> Result<u64, E> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |v, b| v << 8 | u64::from(*b)))
    }

    fn peek(&self) -> Result<u8, E> {
        self.buf
            .get(self.at)
            .copied()
            .ok_or_else(|| E::from(ReadError::Truncated))
    }

    /// True (and consumed) when the next value is nil.
    pub fn nil(&mut self) -> Result<bool, E> {
        if self.peek()? == 0xc0 {
            self.at += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A map header: its number of entries.
    pub fn map(&mut self) -> Result<usize, E> {
        let n = match self.byte()? {
            b @ 0x80..=0x8f => u64::from(b & 0x0f),
            0xde => self.be(2)?,
            0xdf => self.be(4)?,
            0xc0 => 0,
            b => return Err(ReadError::Type("map", b).into()),
        };
        self.count(n, 2)
    }

    /// An array header: its number of items (nil is an empty array).
    pub fn array(&mut self) -> Result<usize, E> {
        let n = match self.byte()? {
            b @ 0x90..=0x9f => u64::from(b & 0x0f),
            0xdc => self.be(2)?,
            0xdd => self.be(4)?,
            0xc0 => 0,
            b => return Err(ReadError::Type("array", b).into()),
        };
        self.count(n, 1)
    }

    /// A count of values that must fit in what is left (each value is at
    /// least one byte): a header claiming millions of entries in a short
    /// packet is refused before anything is allocated for them.
    fn count(&self, n: u64, per: u64) -> Result<usize, E> {
        let left = (self.buf.len() - self.at) as u64;
        if n.saturating_mul(per) > left {
            return Err(ReadError::Truncated.into());
        }
        Ok(n as usize)
    }

    /// Raw bytes: str (any form, str8 too), bin, or nil (empty).
    pub fn bytes(&mut self) -> Result<&'a [u8], E> {
        let n = match self.byte()? {
            b @ 0xa0..=0xbf => u64::from(b & 0x1f),
            0xd9 | 0xc4 => self.be(1)?,
            0xda | 0xc5 => self.be(2)?,
            0xdb | 0xc6 => self.be(4)?,
            0xc0 => 0,
            b => return Err(ReadError::Type("bytes", b).into()),
        };
        self.take(n as usize)
    }

    /// A string (UTF-8 checked).
    pub fn str(&mut self) -> Result<&'a str, E> {
        std::str::from_utf8(self.bytes()?).map_err(|_| ReadError::Utf8.into())
    }

    /// Any integer form that is not negative.
    pub fn uint(&mut self) -> Result<u64, E> {
        let v = self.int()?;
        u64::try_from(v).map_err(|_| ReadError::Range.into())
    }

    /// Any integer form, as i128 so every u64 and i64 fits.
    pub fn int(&mut self) -> Result<i128, E> {
        Ok(match self.byte()? {
            b @ 0x00..=0x7f => i128::from(b),
            b @ 0xe0..=0xff => i128::from(b as i8),
            0xcc => i128::from(self.be(1)?),
            0xcd => i128::from(self.be(2)?),
            0xce => i128::from(self.be(4)?),
            0xcf => i128::from(self.be(8)?),
            0xd0 => i128::from(self.be(1)? as u8 as i8),
            0xd1 => i128::from(self.be(2)? as u16 as i16),
            0xd2 => i128::from(self.be(4)? as u32 as i32),
            0xd3 => i128::from(self.be(8)? as i64),
            0xc0 => 0,
            b => return Err(ReadError::Type("integer", b).into()),
        })
    }

    /// An unsigned integer that must fit `T`.
    pub fn uint_as<T: TryFrom<u64>>(&mut self) -> Result<T, E> {
        T::try_from(self.uint()?).map_err(|_| ReadError::Range.into())
    }

    /// A float (float32 or float64; integers too, as Go accepts them).
    pub fn float(&mut self) -> Result<f64, E> {
        match self.peek()? {
            0xcb => {
                self.at += 1;
                Ok(f64::from_bits(self.be(8)?))
            }
            0xca => {
                self.at += 1;
                Ok(f64::from(f32::from_bits(self.be(4)? as u32)))
            }
            _ => Ok(self.int()? as f64),
        }
    }

    /// A boolean (nil is false).
    pub fn bool(&mut self) -> Result<bool, E> {
        match self.byte()? {
            0xc2 | 0xc0 => Ok(false),
            0xc3 => Ok(true),
            b => Err(ReadError::Type("bool", b).into()),
        }
    }

    /// Skips one value of any type.
    pub fn skip(&mut self) -> Result<(), E> {
        self.skip_depth(0)
    }

    fn skip_depth(&mut self, depth: usize) -> Result<(), E> {
        if depth > MAX_DEPTH {
            return Err(ReadError::TooDeep.into());
        }
        let b = self.peek()?;
        match b {
            0x80..=0x8f | 0xde | 0xdf => {
                let n = self.map()?;
                for _ in 0..n * 2 {
                    self.skip_depth(depth + 1)?;
                }
            }
            0x90..=0x9f | 0xdc | 0xdd => {
                let n = self.array()?;
                for _ in 0..n {
                    self.skip_depth(depth + 1)?;
                }
            }
            0xa0..=0xbf | 0xd9..=0xdb | 0xc4..=0xc6 => {
                self.bytes()?;
            }
            0xc0 | 0xc2 | 0xc3 => self.at += 1,
            0xca | 0xcb => {
                self.float()?;
            }
            0xd4..=0xd8 | 0xc7..=0xc9 => {
                // fixext / ext: a type byte and data.
                self.at += 1;
                let n = match b {
                    0xd4 => 1,
                    0xd5 => 2,
                    0xd6 => 4,
                    0xd7 => 8,
                    0xd8 => 16,
                    0xc7 => self.be(1)? as usize,
                    0xc8 => self.be(2)? as usize,
                    _ => self.be(4)? as usize,
                };
                self.take(n + 1)?;
            }
            _ => {
                self.int()?;
            }
        }
        Ok(())
    }

    /// Walks a struct written as a map of field names: `field` is called
    /// with each key and must read (or skip) its value.
    pub fn fields(
        &mut self,
        mut field: impl FnMut(&str, &mut Self) -> Result<(), E>,
    ) -> Result<(), E> {
        let n = self.map()?;
        for _ in 0..n {
            let k = self.str()?;
            field(k, self)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::Writer;

    fn reader(b: &[u8]) -> Reader<'_> {
        Reader::new(b)
    }

    #[test]
    fn what_the_writer_writes_reads_back() {
        let mut b = Vec::new();
        Writer(&mut b)
            .map(3)
            .kv_str("Node", "agent-1")
            .kv_uint("SeqNo", 70000)
            .str("Addr")
            .raw(&[127, 0, 0, 1]);
        let mut r = reader(&b);
        let (mut node, mut seq, mut addr) = ("", 0, &[][..]);
        r.fields(|k, r| -> Result<(), ReadError> {
            match k {
                "Node" => node = r.str()?,
                "SeqNo" => seq = r.uint()?,
                "Addr" => addr = r.bytes()?,
                _ => r.skip()?,
            }
            Ok(())
        })
        .unwrap();
        assert_eq!((node, seq, addr), ("agent-1", 70000, &[127, 0, 0, 1][..]));
        assert!(r.rest().is_empty());
    }

    #[test]
    fn a_header_claiming_more_than_the_packet_holds_is_refused() {
        // map32 of 4 billion entries in a 5-byte packet.
        let b = [0xdf, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(reader(&b).map(), Err(ReadError::Truncated));
        let b = [0xdb, 0x00, 0x10, 0x00, 0x00, b'x'];
        assert_eq!(reader(&b).bytes(), Err(ReadError::Truncated));
    }

    #[test]
    fn nesting_past_the_bound_is_refused_not_recursed() {
        let b = vec![0x91; 10_000];
        assert_eq!(reader(&b).skip(), Err(ReadError::TooDeep));
    }
}
