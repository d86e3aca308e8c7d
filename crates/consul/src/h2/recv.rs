//! What the server's frames do to a [`Conn`]: one frame at a time from
//! the read buffer (settings and pings answered, window updates counted,
//! header blocks decoded into a call's start or end, resets and GOAWAY),
//! and the messages of a call split from its DATA frames.

use std::borrow::Cow;
use std::sync::Arc;

use tonic::{Code, Status};

use super::frame::{self, Head};
use super::{Conn, ConnError, Continued, Data, Got, StreamReset, UPDATE_AT};

/// What handling the next frame gave.
pub(super) enum Step<T> {
    /// Something to tell the caller.
    Got(Got<T>),
    /// A frame was handled; nothing to tell.
    Handled,
    /// No whole frame is buffered.
    NeedBytes,
}

/// The fields of a header block a call's start and end need.
#[derive(Debug, Default)]
struct Fields {
    status: Option<u16>,
    grpc_status: Option<i32>,
    grpc_message: Option<String>,
    /// The block's decoded size (names, values and 32 per field).
    size: usize,
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2).
fn percent_decoded(v: &[u8]) -> String {
    let mut out = Vec::with_capacity(v.len());
    let mut i = 0;
    while i < v.len() {
        let hex = v
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (v[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The status of a call whose response is not HTTP 200 (gRPC's mapping
/// of HTTP codes).
fn http_status(code: u16) -> Status {
    let c = match code {
        400 => Code::Internal,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::Unimplemented,
        429 | 502..=504 => Code::Unavailable,
        _ => Code::Unknown,
    };
    Status::new(c, format!("the server answered HTTP status {code}"))
}

/// The status a reset stream ends its call with (gRPC's mapping of
/// HTTP/2 error codes); its source says it was a reset.
fn reset_status(code: u32) -> Status {
    let c = match code {
        0x7 => Code::Unavailable,
        0x8 => Code::Cancelled,
        0xb => Code::ResourceExhausted,
        0xc => Code::PermissionDenied,
        0x0..=0x6 | 0x9 | 0xa => Code::Internal,
        _ => Code::Unknown,
    };
    let mut s = Status::new(c, StreamReset(code).to_string());
    s.set_source(Arc::new(StreamReset(code)));
    s
}

impl Fields {
    /// The status the block's trailers say.
    fn ending(self) -> Status {
        match self.grpc_status {
            Some(code) => Status::new(Code::from_i32(code), self.grpc_message.unwrap_or_default()),
            None => Status::new(
                Code::Unknown,
                "the server ended the call without a grpc-status",
            ),
        }
    }
}

impl<IO> Conn<IO> {
    /// Handles the next whole frame in the read buffer.
    pub(super) fn next_frame<T>(&mut self) -> Result<Step<T>, ConnError> {
        let avail = &self.rbuf[self.rpos..];
        let Some(h) = frame::head(avail) else {
            return Ok(Step::NeedBytes);
        };
        if h.len > frame::MAX_FRAME {
            return Err(ConnError::FrameSize {
                kind: h.kind,
                len: h.len,
            });
        }
        if avail.len() < 9 + h.len {
            self.rbuf.reserve_exact(9 + h.len - avail.len());
            return Ok(Step::NeedBytes);
        }
        let start = self.rpos + 9;
        self.rpos = start + h.len;
        if self.continued.is_some() && h.kind != frame::CONTINUATION {
            return Err(ConnError::Protocol("a frame inside a header block"));
        }
        match h.kind {
            frame::DATA => self.on_data(&h, start),
            frame::HEADERS | frame::CONTINUATION => self.on_headers(&h, start),
            frame::RST_STREAM => Ok(self.on_reset(&h, start)),
            frame::SETTINGS => self.on_settings(&h, start),
            frame::PING => self.on_ping(&h, start),
            frame::GOAWAY => self.on_goaway(&h, start),
            frame::WINDOW_UPDATE => {
                let w = self.word(&h, start)?;
                self.on_window(h.stream, w);
                Ok(Step::Handled)
            }
            frame::PUSH_PROMISE => Err(ConnError::Protocol("a push, which the client refused")),
            // PRIORITY and unknown types are ignored.
            _ => Ok(Step::Handled),
        }
    }

    /// The one 32-bit word of a WINDOW_UPDATE or RST_STREAM.
    fn word(&self, h: &Head, start: usize) -> Result<u32, ConnError> {
        let b: [u8; 4] = self.rbuf[start..start + h.len]
            .try_into()
            .map_err(|_| ConnError::Protocol("a frame of the wrong size"))?;
        Ok(u32::from_be_bytes(b))
    }

    fn on_data<T>(&mut self, h: &Head, start: usize) -> Result<Step<T>, ConnError> {
        if h.stream == 0 {
            return Err(ConnError::Protocol("DATA on stream 0"));
        }
        let payload = &self.rbuf[start..start + h.len];
        let (from, to) =
            frame::unpad(h, payload).map_err(|_| ConnError::Protocol("DATA padding"))?;
        let len = h.len as u32;
        self.conn_unacked += len;
        if self.conn_unacked >= UPDATE_AT {
            frame::put_word(&mut self.wbuf, frame::WINDOW_UPDATE, 0, self.conn_unacked);
            self.conn_unacked = 0;
        }
        let end_stream = h.flags & frame::END_STREAM != 0;
        let Some(s) = self.streams.iter_mut().find(|s| s.id == h.stream) else {
            // A call the client cancelled: its data is dropped.
            return Ok(Step::Handled);
        };
        s.unacked += len;
        if s.unacked >= UPDATE_AT && !end_stream {
            frame::put_word(&mut self.wbuf, frame::WINDOW_UPDATE, s.id, s.unacked);
            s.unacked = 0;
        }
        self.data = Some(Data {
            id: h.stream,
            at: start + from,
            end: start + to,
            end_stream,
        });
        Ok(Step::Handled)
    }

    fn on_headers<T>(&mut self, h: &Head, start: usize) -> Result<Step<T>, ConnError> {
        let payload = &self.rbuf[start..start + h.len];
        let end_headers = h.flags & frame::END_HEADERS != 0;
        let (id, end_stream, block) = match (h.kind, self.continued.take()) {
            (frame::HEADERS, None) => {
                if h.stream == 0 {
                    return Err(ConnError::Protocol("HEADERS on stream 0"));
                }
                let (from, to) =
                    frame::unpad(h, payload).map_err(|_| ConnError::Protocol("HEADERS padding"))?;
                let end_stream = h.flags & frame::END_STREAM != 0;
                if !end_headers {
                    self.continued = Some(Box::new(Continued {
                        id: h.stream,
                        end_stream,
                        block: payload[from..to].to_vec(),
                    }));
                    return Ok(Step::Handled);
                }
                (h.stream, end_stream, Cow::Borrowed(&payload[from..to]))
            }
            (frame::CONTINUATION, Some(mut c)) if c.id == h.stream => {
                c.block.extend_from_slice(payload);
                if c.block.len() > super::MAX_HEADER_LIST as usize * 2 {
                    return Err(ConnError::Protocol("a header block without end"));
                }
                if !end_headers {
                    self.continued = Some(c);
                    return Ok(Step::Handled);
                }
                (c.id, c.end_stream, Cow::Owned(c.block))
            }
            _ => return Err(ConnError::Protocol("a CONTINUATION out of place")),
        };
        let mut f = Fields::default();
        self.hpack.decode(&block, |name, value| {
            f.size += name.len() + value.len() + 32;
            match name {
                b":status" => {
                    f.status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok())
                }
                b"grpc-status" => {
                    f.grpc_status = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok())
                }
                b"grpc-message" => f.grpc_message = Some(percent_decoded(value)),
                _ => {}
            }
        })?;
        Ok(self.on_fields(id, end_stream, f))
    }

    /// A whole header block of call `id`: its start, or its end.
    fn on_fields<T>(&mut self, id: u32, end_stream: bool, f: Fields) -> Step<T> {
        let Some(i) = self.streams.iter().position(|s| s.id == id) else {
            return Step::Handled;
        };
        let s = &mut self.streams[i];
        let tag = s.tag;
        if f.size > super::MAX_HEADER_LIST as usize {
            self.cancel(tag);
            let words = format!("a header block of {} octets, over the limit", f.size);
            return Step::Got(Got::Ended(tag, Status::internal(words)));
        }
        if !s.started {
            match f.status {
                Some(200) if !end_stream => {
                    s.started = true;
                    return Step::Got(Got::Started(tag));
                }
                // Trailers only: the call ended at once.
                Some(200) => {}
                Some(code) => {
                    self.cancel(tag);
                    return Step::Got(Got::Ended(tag, http_status(code)));
                }
                None => {
                    self.cancel(tag);
                    let status = Status::internal("the server's response has no :status");
                    return Step::Got(Got::Ended(tag, status));
                }
            }
        } else if !end_stream {
            // Headers in the middle of a call: nothing gRPC sends.
            return Step::Handled;
        }
        self.remove(i);
        Step::Got(Got::Ended(tag, f.ending()))
    }

    fn on_reset<T>(&mut self, h: &Head, start: usize) -> Step<T> {
        let Ok(code) = self.word(h, start) else {
            return Step::Handled;
        };
        let Some(i) = self.streams.iter().position(|s| s.id == h.stream) else {
            return Step::Handled;
        };
        let s = self.remove(i);
        Step::Got(Got::Ended(s.tag, reset_status(code)))
    }

    fn on_settings<T>(&mut self, h: &Head, start: usize) -> Result<Step<T>, ConnError> {
        if h.stream != 0 || !h.len.is_multiple_of(6) {
            return Err(ConnError::Protocol("a malformed SETTINGS frame"));
        }
        if h.flags & frame::ACK != 0 {
            return Ok(Step::Handled);
        }
        // Of the server's values only its initial window binds what the
        // client sends: every request is far under any other limit.
        let mut window = None;
        for pair in self.rbuf[start..start + h.len].chunks_exact(6) {
            if u16::from_be_bytes([pair[0], pair[1]]) == frame::SETTINGS_INITIAL_WINDOW_SIZE {
                window = Some(u32::from_be_bytes([pair[2], pair[3], pair[4], pair[5]]));
            }
        }
        frame::put_head(&mut self.wbuf, 0, frame::SETTINGS, frame::ACK, 0);
        if let Some(size) = window {
            self.on_initial_window(size)?;
        }
        Ok(Step::Handled)
    }

    fn on_ping<T>(&mut self, h: &Head, start: usize) -> Result<Step<T>, ConnError> {
        let opaque: [u8; 8] = self.rbuf[start..start + h.len]
            .try_into()
            .map_err(|_| ConnError::Protocol("a PING of the wrong size"))?;
        if h.flags & frame::ACK == 0 {
            frame::put_ping(&mut self.wbuf, true, opaque);
        }
        Ok(Step::Handled)
    }

    fn on_goaway<T>(&mut self, h: &Head, start: usize) -> Result<Step<T>, ConnError> {
        let p = &self.rbuf[start..start + h.len];
        if p.len() < 8 {
            return Err(ConnError::Protocol("a GOAWAY too short"));
        }
        let last = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
        let code = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
        let debug = String::from_utf8_lossy(&p[8..]).into_owned();
        // Calls past its last stream were not taken: they end now.
        for s in self.streams.extract_if(.., |s| s.id > last) {
            let status = Status::unavailable("the server went away before taking the call");
            self.refused.push((s.tag, status));
        }
        self.going_away = Some(ConnError::GoAway { code, debug });
        Ok(Step::Handled)
    }

    /// The next message split from the DATA frame in hand, or the call's
    /// end when the frame ended it.
    pub(super) fn next_message<T>(
        &mut self,
        decode: &mut impl FnMut(usize, &[u8]) -> T,
    ) -> Option<Got<T>> {
        let mut d = self.data?;
        let Some(i) = self.streams.iter().position(|s| s.id == d.id) else {
            self.data = None;
            return None;
        };
        let max = self.max_message;
        let s = &mut self.streams[i];
        let tag = s.tag;
        while d.at < d.end {
            let avail = &self.rbuf[d.at..d.end];
            // A whole message in the frame: decoded where it lies.
            if s.msg.is_empty() && avail.len() >= 5 {
                let len = message_len(avail);
                if let Err(status) = check_prefix(avail[0], len, max) {
                    return Some(self.fail_stream(tag, status));
                }
                if avail.len() >= 5 + len {
                    let got = decode(tag, &avail[5..5 + len]);
                    d.at += 5 + len;
                    self.data = Some(d);
                    return Some(Got::Message(tag, got));
                }
            }
            // A message over frames: gathered.
            let want = if s.msg.len() < 5 {
                5 - s.msg.len()
            } else {
                5 + message_len(&s.msg) - s.msg.len()
            };
            let take = want.min(avail.len());
            s.msg.extend_from_slice(&avail[..take]);
            d.at += take;
            if s.msg.len() == 5 {
                let len = message_len(&s.msg);
                if let Err(status) = check_prefix(s.msg[0], len, max) {
                    return Some(self.fail_stream(tag, status));
                }
                s.msg.reserve_exact(len);
            }
            if s.msg.len() >= 5 && s.msg.len() == 5 + message_len(&s.msg) {
                let got = decode(tag, &s.msg[5..]);
                s.msg = Vec::new();
                self.data = Some(d);
                return Some(Got::Message(tag, got));
            }
        }
        self.data = None;
        if d.end_stream {
            self.remove(i);
            let status = Status::internal("the server ended the call without trailers");
            return Some(Got::Ended(tag, status));
        }
        None
    }

    /// Ends call `tag` with `status` and resets its stream (the rest of
    /// its frame with it).
    fn fail_stream<T>(&mut self, tag: usize, status: Status) -> Got<T> {
        self.cancel(tag);
        Got::Ended(tag, status)
    }
}

/// The length in a message's 5-octet prefix.
fn message_len(b: &[u8]) -> usize {
    u32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize
}

/// A message's prefix: not compressed (none was asked for) and within
/// the limit (checked before any buffer is reserved for it).
fn check_prefix(flag: u8, len: usize, max: usize) -> Result<(), Status> {
    if flag != 0 {
        return Err(Status::internal(
            "the server sent a compressed message, but the call asked for none",
        ));
    }
    if len > max {
        return Err(Status::out_of_range(format!(
            "message length too large: found {len} bytes, the limit is: {max} bytes"
        )));
    }
    Ok(())
}
