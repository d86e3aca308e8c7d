//! The msgpack reader memberlist and serf messages are read with: the tree's
//! one reader ([`agent_sim_proto::msgpack::Reader`]), its errors counted as
//! this crate's [`WireError`] causes.

use agent_sim_proto::msgpack::ReadError;

use super::WireError;

/// A reader whose reads fail with this crate's [`WireError`].
pub type Reader<'a> = agent_sim_proto::msgpack::Reader<'a, WireError>;

impl From<ReadError> for WireError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Truncated => WireError::Truncated,
            ReadError::Type(want, marker) => WireError::Type(want, marker),
            ReadError::Range => WireError::Range,
            ReadError::Utf8 => WireError::Utf8,
            ReadError::TooDeep => WireError::TooDeep,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_read_error_keeps_its_cause() {
        let cases = [
            (ReadError::Truncated, "truncated"),
            (ReadError::Type("map", 0xc3), "malformed"),
            (ReadError::Range, "malformed"),
            (ReadError::Utf8, "malformed"),
            (ReadError::TooDeep, "malformed"),
        ];
        for (e, cause) in cases {
            assert_eq!(WireError::from(e).cause(), cause, "{e}");
        }
        assert_eq!(
            WireError::from(ReadError::Type("map", 0xc3)),
            WireError::Type("map", 0xc3)
        );
    }
}
