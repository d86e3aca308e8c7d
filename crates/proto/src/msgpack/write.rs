//! Writing msgpack as Consul's Go codec does (`structs.MsgpackHandle`,
//! which keeps to the msgpack spec before 2013's `str8` and `bin`):
//!
//! - strings up to 31 bytes are fixstr, longer ones str16 (never str8), the
//!   way a real agent wrote a 36-byte node ID (`da 00 24 …`);
//! - integers take their smallest form, non-negative ones unsigned (a port
//!   8080 is `cd 1f 90`, 15 s in nanoseconds is uint64);
//! - maps of up to 15 entries are fixmap, larger ones map16 (a Go struct is a
//!   map of its field names in sorted order: the caller writes them so);
//! - floats are float64, nil is `c0`.
//!
//! Writing into a `Vec` cannot fail, so nothing here returns an error.

/// Appends msgpack values to a buffer.
#[derive(Debug)]
pub struct Writer<'a>(pub &'a mut Vec<u8>);

impl Writer<'_> {
    /// A map header of `n` entries (each a key and a value follow).
    pub fn map(&mut self, n: u32) -> &mut Self {
        match n {
            0..=15 => self.0.push(0x80 | n as u8),
            16..=0xffff => {
                self.0.push(0xde);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xdf);
                self.0.extend_from_slice(&n.to_be_bytes());
            }
        }
        self
    }

    /// An array header of `n` items.
    pub fn array(&mut self, n: u32) -> &mut Self {
        match n {
            0..=15 => self.0.push(0x90 | n as u8),
            16..=0xffff => {
                self.0.push(0xdc);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xdd);
                self.0.extend_from_slice(&n.to_be_bytes());
            }
        }
        self
    }

    /// A string: fixstr, str16 or str32 (no str8, as Go's old-spec codec).
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.raw(s.as_bytes())
    }

    /// Bytes as the old spec's raw type (a Go `[]byte` under a handle
    /// without `WriteExt`, as memberlist's and serf's codecs write them):
    /// the same markers as [`Writer::str`].
    pub fn raw(&mut self, s: &[u8]) -> &mut Self {
        let n = s.len();
        if n < 32 {
            self.0.push(0xa0 | n as u8);
        } else if n <= 0xffff {
            self.0.push(0xda);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xdb);
            self.0.extend_from_slice(&(n as u32).to_be_bytes());
        }
        self.0.extend_from_slice(s);
        self
    }

    /// An unsigned integer in its smallest form.
    pub fn uint(&mut self, v: u64) -> &mut Self {
        if v < 0x80 {
            self.0.push(v as u8);
        } else if v <= 0xff {
            self.0.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            self.0.push(0xcd);
            self.0.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            self.0.push(0xce);
            self.0.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.0.push(0xcf);
            self.0.extend_from_slice(&v.to_be_bytes());
        }
        self
    }

    /// A signed integer: unsigned forms when not negative, else the
    /// smallest signed one.
    pub fn int(&mut self, v: i64) -> &mut Self {
        if v >= 0 {
            return self.uint(v as u64);
        }
        if v >= -32 {
            self.0.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.0.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.0.push(0xd1);
            self.0.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.0.push(0xd2);
            self.0.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.0.push(0xd3);
            self.0.extend_from_slice(&v.to_be_bytes());
        }
        self
    }

    /// A float64.
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.0.push(0xcb);
        self.0.extend_from_slice(&v.to_bits().to_be_bytes());
        self
    }

    /// `true` or `false`.
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.0.push(if v { 0xc3 } else { 0xc2 });
        self
    }

    /// nil (a Go nil pointer, slice or map).
    pub fn nil(&mut self) -> &mut Self {
        self.0.push(0xc0);
        self
    }

    /// A key and a string value.
    pub fn kv_str(&mut self, k: &str, v: &str) -> &mut Self {
        self.str(k).str(v)
    }

    /// A key and an unsigned value.
    pub fn kv_uint(&mut self, k: &str, v: u64) -> &mut Self {
        self.str(k).uint(v)
    }

    /// A key and a boolean value.
    pub fn kv_bool(&mut self, k: &str, v: bool) -> &mut Self {
        self.str(k).bool(v)
    }

    /// A key and nil.
    pub fn kv_nil(&mut self, k: &str) -> &mut Self {
        self.str(k).nil()
    }

    /// Keys whose values are all `false` (a Go struct's unset flags).
    pub fn falses(&mut self, keys: &[&str]) -> &mut Self {
        for k in keys {
            self.kv_bool(k, false);
        }
        self
    }

    /// Keys whose values are all empty strings.
    pub fn empties(&mut self, keys: &[&str]) -> &mut Self {
        for k in keys {
            self.kv_str(k, "");
        }
        self
    }

    /// Keys whose values are all zero.
    pub fn zeros(&mut self, keys: &[&str]) -> &mut Self {
        for k in keys {
            self.kv_uint(k, 0);
        }
        self
    }

    /// A map of string pairs, in the order given (Go writes its maps in a
    /// random order; a reader must not care).
    pub fn str_map(&mut self, pairs: &[(&str, &str)]) -> &mut Self {
        self.map(pairs.len() as u32);
        for (k, v) in pairs {
            self.kv_str(k, v);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msgpack::value_len;

    fn bytes(f: impl FnOnce(&mut Writer<'_>)) -> Vec<u8> {
        let mut b = Vec::new();
        f(&mut Writer(&mut b));
        b
    }

    #[test]
    fn strings_skip_str8_as_gos_old_spec_codec() {
        assert_eq!(
            bytes(|w| {
                w.str("dc1");
            }),
            b"\xa3dc1"
        );
        let id = "6f1b2d3c-0a4e-4b5f-8c9d-0e1f2a3b4c11";
        let b = bytes(|w| {
            w.str(id);
        });
        assert_eq!(&b[..3], &[0xda, 0x00, 0x24]);
        assert_eq!(&b[3..], id.as_bytes());
        let long = "x".repeat(70_000);
        assert_eq!(
            bytes(|w| {
                w.str(&long);
            })[..5],
            [0xdb, 0, 1, 0x11, 0x70]
        );
    }

    #[test]
    fn integers_take_their_smallest_form() {
        assert_eq!(
            bytes(|w| {
                w.uint(1);
            }),
            [1]
        );
        assert_eq!(
            bytes(|w| {
                w.uint(200);
            }),
            [0xcc, 200]
        );
        assert_eq!(
            bytes(|w| {
                w.uint(8080);
            }),
            [0xcd, 0x1f, 0x90]
        );
        assert_eq!(
            bytes(|w| {
                w.uint(2_000_000_000);
            }),
            [0xce, 0x77, 0x35, 0x94, 0x00]
        );
        assert_eq!(
            bytes(|w| {
                w.uint(15_000_000_000);
            }),
            [0xcf, 0, 0, 0, 0x03, 0x7e, 0x11, 0xd6, 0]
        );
        assert_eq!(
            bytes(|w| {
                w.int(5);
            }),
            [5]
        );
        assert_eq!(
            bytes(|w| {
                w.int(-1);
            }),
            [0xff]
        );
        assert_eq!(
            bytes(|w| {
                w.int(-100);
            }),
            [0xd0, 0x9c]
        );
        assert_eq!(
            bytes(|w| {
                w.int(-1000);
            }),
            [0xd1, 0xfc, 0x18]
        );
    }

    #[test]
    fn maps_past_fifteen_entries_are_map16_and_values_scan_whole() {
        let b = bytes(|w| {
            w.map(16);
            for i in 0..16u64 {
                w.kv_uint(&format!("k{i:02}"), i);
            }
        });
        assert_eq!(&b[..3], &[0xde, 0, 16]);
        assert_eq!(value_len(&b).unwrap(), Some(b.len()));
        let b = bytes(|w| {
            w.map(2).kv_nil("a").str("v").array(2).f64(1.5).bool(true);
        });
        assert_eq!(value_len(&b).unwrap(), Some(b.len()));
        assert_eq!(b[0], 0x82);
    }
}
