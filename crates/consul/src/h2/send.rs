//! What the client sends on its calls: a call's headers, its requests as
//! DATA frames within both of the server's flow-control windows (the
//! connection's and the call's own), the end of its requests, and what a
//! WINDOW_UPDATE or a new SETTINGS_INITIAL_WINDOW_SIZE lets out.
//!
//! A request that fits the windows is framed where it is encoded, in the
//! write buffer; only one that does not is kept on its call (`out`) until
//! the server opens its windows, and that buffer is freed once sent.

use tonic::Status;

use super::frame;
use super::hpack;
use super::{Conn, ConnError, Stream, USER_AGENT};

/// A call whose unsent requests grow past this ends the connection: the
/// server left its windows shut while the client kept asking.
const MAX_UNSENT: usize = 4 << 20;

impl<IO> Conn<IO> {
    /// Opens call `tag` on `path` with `metadata` (gRPC's custom headers,
    /// lowercase names, such as an ACL token) and no request yet: requests
    /// follow with [`Conn::send`], their end with [`Conn::close_send`]. A
    /// call of the same tag still open is cancelled; a connection going
    /// away refuses the call (it ends with `UNAVAILABLE` at the next poll)
    /// and `false` is returned.
    pub fn open(&mut self, tag: usize, path: &str, metadata: &[(&str, &str)]) -> bool {
        self.cancel(tag);
        if self.going_away.is_some() || self.ended.is_some() {
            let status = Status::unavailable("the connection is going away");
            self.refused.push((tag, status));
            return false;
        }
        let id = self.next_id;
        self.next_id += 2;
        let w = &mut self.wbuf;
        let head_at = w.len();
        frame::put_head(w, 0, frame::HEADERS, frame::END_HEADERS, id);
        hpack::put_indexed(w, 3); // :method POST
        hpack::put_indexed(w, 6); // :scheme http
        hpack::put_field(w, 4, ":path", path);
        hpack::put_field(w, 1, ":authority", &self.authority);
        hpack::put_field(w, 31, "content-type", "application/grpc");
        hpack::put_field(w, 0, "te", "trailers");
        hpack::put_field(w, 58, "user-agent", USER_AGENT);
        for (name, value) in metadata {
            hpack::put_field(w, 0, name, value);
        }
        let block = w.len() - head_at - 9;
        // Paths, authorities and tokens are far under one frame.
        debug_assert!(block <= frame::MAX_FRAME);
        w[head_at..head_at + 3].copy_from_slice(&(block as u32).to_be_bytes()[1..]);
        self.streams.push(Stream {
            id,
            tag,
            started: false,
            unacked: 0,
            msg: Vec::new(),
            send_window: i64::from(self.peer_window),
            out: Vec::new(),
            closing: false,
            end_sent: false,
        });
        true
    }

    /// Sends one request on open call `tag`, `encode` appending its bytes;
    /// `false` when the call is not open or its requests were ended.
    pub fn send(&mut self, tag: usize, encode: impl FnOnce(&mut Vec<u8>)) -> bool {
        self.push(tag, encode, false)
    }

    /// Ends the requests of call `tag` (END_STREAM goes out once what it
    /// holds is sent).
    pub fn close_send(&mut self, tag: usize) {
        if let Some(i) = self.position(tag)
            && !self.streams[i].closing
        {
            self.streams[i].closing = true;
            self.flush_call(i);
        }
    }

    /// Where call `tag` is among the open calls.
    pub(super) fn position(&self, tag: usize) -> Option<usize> {
        self.streams.iter().position(|s| s.tag == tag)
    }

    /// One request on call `tag`, the last of its requests when `last`
    /// (END_STREAM on its frame, as grpc-go sends a unary request).
    pub(super) fn push(
        &mut self,
        tag: usize,
        encode: impl FnOnce(&mut Vec<u8>),
        last: bool,
    ) -> bool {
        let Some(i) = self.position(tag) else {
            return false;
        };
        let s = &mut self.streams[i];
        if s.closing {
            return false;
        }
        s.closing = last;
        if s.out.is_empty() {
            let w = &mut self.wbuf;
            let head_at = w.len();
            frame::put_head(w, 0, frame::DATA, 0, s.id);
            let msg_at = w.len();
            w.extend_from_slice(&[0; 5]);
            encode(w);
            let body = w.len() - msg_at;
            set_prefix(&mut w[msg_at..]);
            let open = s.send_window.min(self.send_window);
            if body <= frame::MAX_FRAME && body as i64 <= open {
                w[head_at..head_at + 3].copy_from_slice(&(body as u32).to_be_bytes()[1..]);
                if last {
                    w[head_at + 4] = frame::END_STREAM;
                    s.end_sent = true;
                }
                s.send_window -= body as i64;
                self.send_window -= body as i64;
                return true;
            }
            // Over a window or a frame: kept on the call until sent.
            s.out = w.split_off(msg_at);
            w.truncate(head_at);
        } else {
            let at = s.out.len();
            s.out.extend_from_slice(&[0; 5]);
            encode(&mut s.out);
            set_prefix(&mut s.out[at..]);
        }
        self.flush_call(i);
        if self.streams[i].out.len() > MAX_UNSENT {
            self.ended = Some(ConnError::Protocol(
                "the server's flow-control window stayed closed",
            ));
        }
        true
    }

    /// Writes what call `i` holds as far as the windows let it, then its
    /// END_STREAM once its requests are over and all of them are out.
    pub(super) fn flush_call(&mut self, i: usize) {
        let s = &mut self.streams[i];
        // What is written is dropped from `out` once, after the loop (a
        // drain per frame would move the rest of `out` for every frame).
        let mut at = 0;
        while at < s.out.len() {
            let open = s.send_window.min(self.send_window).max(0) as usize;
            let n = open.min(s.out.len() - at).min(frame::MAX_FRAME);
            if n == 0 {
                s.out.drain(..at);
                return;
            }
            let end = at + n == s.out.len() && s.closing;
            let flags = if end { frame::END_STREAM } else { 0 };
            frame::put_head(&mut self.wbuf, n, frame::DATA, flags, s.id);
            self.wbuf.extend_from_slice(&s.out[at..at + n]);
            at += n;
            s.send_window -= n as i64;
            self.send_window -= n as i64;
            s.end_sent |= end;
        }
        s.out = Vec::new();
        if s.closing && !s.end_sent {
            frame::put_head(&mut self.wbuf, 0, frame::DATA, frame::END_STREAM, s.id);
            s.end_sent = true;
        }
    }

    /// A WINDOW_UPDATE of `by` octets for `stream` (0: the connection's).
    pub(super) fn on_window(&mut self, stream: u32, by: u32) {
        let by = i64::from(by & 0x7fff_ffff);
        if stream == 0 {
            self.send_window += by;
            self.flush_waiting();
        } else if let Some(i) = self.streams.iter().position(|s| s.id == stream) {
            self.streams[i].send_window += by;
            if !self.streams[i].out.is_empty() {
                self.flush_call(i);
            }
        }
    }

    /// The server's SETTINGS_INITIAL_WINDOW_SIZE: every open call's window
    /// moves by the change (RFC 9113 section 6.9.2).
    pub(super) fn on_initial_window(&mut self, size: u32) -> Result<(), ConnError> {
        if size > 0x7fff_ffff {
            return Err(ConnError::Protocol(
                "a SETTINGS_INITIAL_WINDOW_SIZE over 2^31-1",
            ));
        }
        let delta = i64::from(size) - i64::from(self.peer_window);
        self.peer_window = size;
        for s in &mut self.streams {
            s.send_window += delta;
        }
        self.flush_waiting();
        Ok(())
    }

    /// Every call holding requests, written as far as the windows let.
    fn flush_waiting(&mut self) {
        for i in 0..self.streams.len() {
            if !self.streams[i].out.is_empty() {
                self.flush_call(i);
            }
        }
    }
}

/// Writes a gRPC message's 5-octet prefix (not compressed, its length) at
/// the start of `msg`, which holds the prefix and the message.
fn set_prefix(msg: &mut [u8]) {
    let len = (msg.len() - 5) as u32;
    msg[0] = 0;
    msg[1..5].copy_from_slice(&len.to_be_bytes());
}
