//! HTTP/2 frames (RFC 9113 section 4 and 6) as bytes: the 9-octet header,
//! the frames a client writes (settings, window updates, pings, resets,
//! a request's headers and data), padding removed from those it reads,
//! and the names of the error codes.

/// The client connection preface.
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Frame types.
pub const DATA: u8 = 0x0;
/// HEADERS.
pub const HEADERS: u8 = 0x1;
/// RST_STREAM.
pub const RST_STREAM: u8 = 0x3;
/// SETTINGS.
pub const SETTINGS: u8 = 0x4;
/// PUSH_PROMISE.
pub const PUSH_PROMISE: u8 = 0x5;
/// PING.
pub const PING: u8 = 0x6;
/// GOAWAY.
pub const GOAWAY: u8 = 0x7;
/// WINDOW_UPDATE.
pub const WINDOW_UPDATE: u8 = 0x8;
/// CONTINUATION.
pub const CONTINUATION: u8 = 0x9;

/// END_STREAM (DATA, HEADERS); ACK (SETTINGS, PING) has the same bit.
pub const END_STREAM: u8 = 0x1;
/// ACK of SETTINGS and PING.
pub const ACK: u8 = 0x1;
/// END_HEADERS (HEADERS, CONTINUATION).
pub const END_HEADERS: u8 = 0x4;
/// PADDED (DATA, HEADERS).
pub const PADDED: u8 = 0x8;
/// PRIORITY (HEADERS).
pub const PRIORITY: u8 = 0x20;

/// SETTINGS_HEADER_TABLE_SIZE.
pub const SETTINGS_HEADER_TABLE_SIZE: u16 = 0x1;
/// SETTINGS_ENABLE_PUSH.
pub const SETTINGS_ENABLE_PUSH: u16 = 0x2;
/// SETTINGS_INITIAL_WINDOW_SIZE.
pub const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
/// SETTINGS_MAX_HEADER_LIST_SIZE.
pub const SETTINGS_MAX_HEADER_LIST_SIZE: u16 = 0x6;

/// The largest frame payload a peer may send before settings raise it
/// (the client never raises it).
pub const MAX_FRAME: usize = 16_384;
/// The initial flow-control window of a stream and of the connection.
pub const INITIAL_WINDOW: u32 = 65_535;

/// Error code CANCEL.
pub const CANCEL: u32 = 0x8;

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Head {
    /// Payload length.
    pub len: usize,
    /// Frame type.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
    /// Stream identifier (the reserved bit cleared).
    pub stream: u32,
}

/// The header at the start of `b`, if 9 octets are there.
pub fn head(b: &[u8]) -> Option<Head> {
    let h: &[u8; 9] = b.get(..9)?.try_into().ok()?;
    Some(Head {
        len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
        kind: h[3],
        flags: h[4],
        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
    })
}

/// Appends a frame header.
pub fn put_head(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    out.extend_from_slice(&(len as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
}

/// Appends a SETTINGS frame with `pairs`.
pub fn put_settings(out: &mut Vec<u8>, pairs: &[(u16, u32)]) {
    put_head(out, pairs.len() * 6, SETTINGS, 0, 0);
    for &(id, v) in pairs {
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// Appends a frame whose payload is one 32-bit word (WINDOW_UPDATE,
/// RST_STREAM).
pub fn put_word(out: &mut Vec<u8>, kind: u8, stream: u32, word: u32) {
    put_head(out, 4, kind, 0, stream);
    out.extend_from_slice(&word.to_be_bytes());
}

/// Appends a PING (an answer when `ack`).
pub fn put_ping(out: &mut Vec<u8>, ack: bool, opaque: [u8; 8]) {
    put_head(out, 8, PING, if ack { ACK } else { 0 }, 0);
    out.extend_from_slice(&opaque);
}

/// A frame whose padding or priority fields do not fit its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadPadding;

/// The payload of a DATA or HEADERS frame without its padding (and, for
/// HEADERS, without the priority fields).
pub fn unpad(h: &Head, payload: &[u8]) -> Result<(usize, usize), BadPadding> {
    let (mut start, mut end) = (0, payload.len());
    if h.flags & PADDED != 0 {
        let pad = usize::from(*payload.first().ok_or(BadPadding)?);
        start = 1;
        end = end.checked_sub(pad).ok_or(BadPadding)?;
    }
    if h.kind == HEADERS && h.flags & PRIORITY != 0 {
        start += 5;
    }
    if start > end {
        return Err(BadPadding);
    }
    Ok((start, end))
}

/// The name of an HTTP/2 error code (RFC 9113 section 7).
pub fn reason(code: u32) -> &'static str {
    match code {
        0x0 => "NO_ERROR",
        0x1 => "PROTOCOL_ERROR",
        0x2 => "INTERNAL_ERROR",
        0x3 => "FLOW_CONTROL_ERROR",
        0x4 => "SETTINGS_TIMEOUT",
        0x5 => "STREAM_CLOSED",
        0x6 => "FRAME_SIZE_ERROR",
        0x7 => "REFUSED_STREAM",
        0x8 => "CANCEL",
        0x9 => "COMPRESSION_ERROR",
        0xa => "CONNECT_ERROR",
        0xb => "ENHANCE_YOUR_CALM",
        0xc => "INADEQUATE_SECURITY",
        0xd => "HTTP_1_1_REQUIRED",
        _ => "an unknown error code",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_round_trips_and_drops_the_reserved_bit() {
        let mut out = Vec::new();
        put_head(&mut out, 0x01_02_03, HEADERS, END_HEADERS, 7);
        assert_eq!(out, [1, 2, 3, 1, 4, 0, 0, 0, 7]);
        out[5] |= 0x80;
        let h = head(&out).unwrap();
        assert_eq!((h.len, h.kind, h.flags, h.stream), (0x01_02_03, 1, 4, 7));
        assert_eq!(head(&out[..8]), None);
    }

    #[test]
    fn padding_and_priority_are_cut_and_checked() {
        let h = |kind, flags| Head {
            len: 0,
            kind,
            flags,
            stream: 1,
        };
        // Pad length 2, "ab", two octets of padding.
        assert_eq!(unpad(&h(DATA, PADDED), &[2, b'a', b'b', 0, 0]), Ok((1, 3)));
        assert_eq!(unpad(&h(DATA, PADDED), &[9, b'a']), Err(BadPadding));
        assert_eq!(unpad(&h(DATA, PADDED), &[]), Err(BadPadding));
        // Priority: 4 octets of dependency and a weight before the block.
        assert_eq!(
            unpad(&h(HEADERS, PRIORITY), &[0, 0, 0, 0, 16, 0x88]),
            Ok((5, 6))
        );
        assert_eq!(unpad(&h(HEADERS, PRIORITY), &[0, 0]), Err(BadPadding));
    }
}
