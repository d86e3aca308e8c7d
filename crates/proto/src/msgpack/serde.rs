//! Whole msgpack values into and out of serde types, as Consul's RPC
//! carries them (structs as maps of their field names).

use ::serde::{Deserialize, Serialize};

use super::MsgpackError;

/// Why a value did not decode as its type.
pub type DecodeError = rmp_serde::decode::Error;
/// Why a value could not be written (a map with a key that is not a
/// string, a sequence of unknown length).
pub type EncodeError = rmp_serde::encode::Error;

/// `bytes` as a `T`, borrowing from them where `T` does.
pub fn decode<'a, T: Deserialize<'a>>(bytes: &'a [u8]) -> Result<T, DecodeError> {
    rmp_serde::from_slice(bytes)
}

/// `bytes` as a `T`; a failure names what was read (`part`: `response
/// header`, `Session.Apply`, ...).
pub fn decode_as<'a, T: Deserialize<'a>>(
    part: &'static str,
    bytes: &'a [u8],
) -> Result<T, MsgpackError> {
    decode(bytes).map_err(|e| MsgpackError::decode(part, e))
}

/// `v` with structs as maps of their field names (what Consul's codec
/// writes and reads).
pub fn encode_named<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Args<'a> {
        #[serde(rename = "Node")]
        node: &'a str,
        #[serde(rename = "Index")]
        index: u64,
    }

    #[test]
    fn a_struct_written_by_name_reads_back_and_a_wrong_type_names_its_part() {
        let b = encode_named(&Args {
            node: "agent-1",
            index: 70_000,
        })
        .unwrap();
        // fixmap of 2, keys by name.
        assert_eq!(b[0], 0x82);
        assert_eq!(
            decode::<Args<'_>>(&b).unwrap(),
            Args {
                node: "agent-1",
                index: 70_000
            }
        );
        let e = decode_as::<u64>("Session.Apply", &b).unwrap_err();
        assert!(e.to_string().starts_with("msgpack: Session.Apply: "), "{e}");
    }
}
