//! The gRPC codec of every agent-sim client and of the embedded server: a
//! prost codec whose buffers the caller sizes (tonic's default is 8 KiB per
//! stream and side; agent-sim holds tens of thousands of streams), and
//! whose decoder may look at each message before prost decodes it (to
//! count top-level fields the API does not define, with [`crate::scan`]).
//!
//! - [`Buffers`]: the starting size of the encode and decode buffers.
//! - [`Profile`]: what a caller chooses: its buffers, and what it does with
//!   each incoming message ([`Profile::inspect`], nothing by default).
//! - [`SmallCodec`]: the codec; its encoder is any [`SizedEncoder`]:
//!   [`ProstEncoder`] for messages, [`PreEncoded`] for bytes encoded once
//!   and shared (an event sent to many subscribers, a request queued in an
//!   outbox), or the caller's own.
//! - [`SmallDecoder`]: prost's decoder after the profile's look.
//!
//! What it is not: no transport, no message limits (tonic's
//! `max_decoding_message_size` stays with each call), no metrics (a
//! profile counts where its caller keeps counts).

use std::marker::PhantomData;

use bytes::{BufMut, Bytes};
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// How much a buffer takes before tonic yields to flush it (tonic's own
/// default, the same for every codec here).
pub const YIELD_THRESHOLD: usize = 32 * 1024;

/// Starting sizes of a codec's buffers (each grows on demand for a larger
/// message, then stays at that size for the stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Buffers {
    /// The encode buffer.
    pub encode: usize,
    /// The decode buffer.
    pub decode: usize,
}

impl Buffers {
    /// `encode` and `decode` bytes.
    pub const fn new(encode: usize, decode: usize) -> Buffers {
        Buffers { encode, decode }
    }

    /// tonic's settings of the encode side.
    pub fn encode_settings(self) -> BufferSettings {
        BufferSettings::new(self.encode, YIELD_THRESHOLD)
    }

    /// tonic's settings of the decode side.
    pub fn decode_settings(self) -> BufferSettings {
        BufferSettings::new(self.decode, YIELD_THRESHOLD)
    }
}

/// A caller's choices for a [`SmallCodec`]: its buffers and its look at
/// each incoming message. Cloned into every decoder the codec makes.
pub trait Profile: Clone + Send + 'static {
    /// The buffers of the codec.
    fn buffers(&self) -> Buffers;

    /// Looks at an encoded incoming message before it is decoded (e.g.
    /// counts unknown top-level fields); must not allocate per message.
    fn inspect(&self, _msg: &[u8]) {}
}

/// Buffers alone are a profile: no look at the messages.
impl Profile for Buffers {
    fn buffers(&self) -> Buffers {
        *self
    }
}

/// An encoder made from tonic's buffer settings.
pub trait SizedEncoder: Encoder<Error = Status> + Send + 'static {
    /// An encoder that reports `settings`.
    fn with_settings(settings: BufferSettings) -> Self;
}

impl<T: prost::Message + Send + 'static> SizedEncoder for ProstEncoder<T> {
    fn with_settings(settings: BufferSettings) -> Self {
        ProstEncoder::new(settings)
    }
}

/// Writes a message encoded beforehand, as it is: encoded once, it is sent
/// on any number of streams without being encoded again.
#[derive(Debug, Clone, Copy)]
pub struct PreEncoded(BufferSettings);

impl Encoder for PreEncoded {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0
    }
}

impl SizedEncoder for PreEncoded {
    fn with_settings(settings: BufferSettings) -> Self {
        PreEncoded(settings)
    }
}

/// Decodes `D` with prost after the profile's look at the message.
#[derive(Debug)]
pub struct SmallDecoder<D, P> {
    inner: ProstDecoder<D>,
    profile: P,
}

impl<D, P: Profile> SmallDecoder<D, P> {
    /// A decoder with `profile`'s buffers and look.
    pub fn new(profile: P) -> Self {
        SmallDecoder {
            inner: ProstDecoder::new(profile.buffers().decode_settings()),
            profile,
        }
    }
}

impl<D, P> Decoder for SmallDecoder<D, P>
where
    D: prost::Message + Default + Send + 'static,
    P: Profile,
{
    type Item = D;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<D>, Status> {
        self.profile.inspect(bytes::Buf::chunk(buf));
        self.inner.decode(buf)
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.inner.buffer_settings()
    }
}

/// A gRPC codec with `profile`'s buffers: writes with `E` (an
/// [`SizedEncoder`]), decodes `D` with a [`SmallDecoder`]. On a client `E`
/// writes requests and `D` is the response; on a server the other way.
pub struct SmallCodec<E, D, P> {
    profile: P,
    _types: PhantomData<fn(D) -> E>,
}

// By hand: derives would ask `E` and `D` for the traits too.
impl<E, D, P: Default> Default for SmallCodec<E, D, P> {
    fn default() -> Self {
        SmallCodec {
            profile: P::default(),
            _types: PhantomData,
        }
    }
}

impl<E, D, P: Clone> Clone for SmallCodec<E, D, P> {
    fn clone(&self) -> Self {
        SmallCodec {
            profile: self.profile.clone(),
            _types: PhantomData,
        }
    }
}

impl<E, D, P: std::fmt::Debug> std::fmt::Debug for SmallCodec<E, D, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmallCodec")
            .field("profile", &self.profile)
            .finish()
    }
}

impl<E, D, P: Profile> SmallCodec<E, D, P> {
    /// A codec of `profile`.
    pub fn new(profile: P) -> Self {
        SmallCodec {
            profile,
            _types: PhantomData,
        }
    }
}

impl<E, D, P> Codec for SmallCodec<E, D, P>
where
    E: SizedEncoder,
    E::Item: Send + 'static,
    D: prost::Message + Default + Send + 'static,
    P: Profile,
{
    type Encode = E::Item;
    type Decode = D;
    type Encoder = E;
    type Decoder = SmallDecoder<D, P>;

    fn encoder(&mut self) -> E {
        E::with_settings(self.profile.buffers().encode_settings())
    }

    fn decoder(&mut self) -> Self::Decoder {
        SmallDecoder::new(self.profile.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// Counts the messages it sees.
    #[derive(Clone, Default)]
    struct Seen(Arc<AtomicUsize>);

    impl Profile for Seen {
        fn buffers(&self) -> Buffers {
            Buffers::new(256, 512)
        }

        fn inspect(&self, msg: &[u8]) {
            self.0.fetch_add(msg.len(), Ordering::Relaxed);
        }
    }

    /// A tonic `BufferSettings` as (size, yield threshold), from its
    /// `Debug` (its fields are private).
    fn sizes(s: BufferSettings) -> String {
        format!("{s:?}")
    }

    #[test]
    fn the_buffers_are_the_profiles() {
        let want = |size: usize| {
            format!("BufferSettings {{ buffer_size: {size}, yield_threshold: {YIELD_THRESHOLD} }}")
        };
        let mut c = SmallCodec::<ProstEncoder<u64>, u64, _>::new(Buffers::new(128, 1024));
        assert_eq!(sizes(c.encoder().buffer_settings()), want(128));
        assert_eq!(sizes(c.decoder().buffer_settings()), want(1024));
        let mut c = SmallCodec::<PreEncoded, u64, _>::new(Seen::default());
        assert_eq!(sizes(c.encoder().buffer_settings()), want(256));
        assert_eq!(sizes(c.decoder().buffer_settings()), want(512));
    }

    #[tokio::test]
    async fn the_decoder_shows_each_message_to_the_profile_then_decodes_it() {
        use prost::Message as _;
        let seen = Seen::default();
        let mut codec = SmallCodec::<PreEncoded, u64, _>::new(seen.clone());
        let one = 300u64.encode_to_vec();
        // gRPC framing: no compression, a 4-byte length, the message; twice.
        let mut body = Vec::new();
        for _ in 0..2 {
            body.push(0);
            body.extend_from_slice(&(one.len() as u32).to_be_bytes());
            body.extend_from_slice(&one);
        }
        let body = http_body_util::Full::new(Bytes::from(body));
        let mut s = tonic::codec::Streaming::new_response(
            codec.decoder(),
            body,
            http::StatusCode::OK,
            None,
            None,
        );
        assert_eq!(s.message().await.unwrap(), Some(300));
        assert_eq!(s.message().await.unwrap(), Some(300));
        assert_eq!(seen.0.load(Ordering::Relaxed), 2 * one.len());
    }
}
