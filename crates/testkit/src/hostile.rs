//! Hostile inputs for decoder property tests: the captured vectors of
//! `testdata/vectors/` and proptest strategies that mutate them the way a
//! broken or malicious peer would (bit flips, truncations, bytes spliced in,
//! length fields made huge).

use std::path::{Path, PathBuf};

use proptest::prelude::*;

/// `testdata/vectors/` of this repository.
pub fn vectors_dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../testdata/vectors"
    ))
    .to_path_buf()
}

/// Every file under `testdata/vectors/<sub>` whose name ends with `suffix`
/// (sorted by name), as (relative path, bytes).
pub fn vectors(sub: &str, suffix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = vectors_dir().join(sub);
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(suffix))
        .map(|e| {
            let name = format!("{sub}/{}", e.file_name().to_string_lossy());
            (name, std::fs::read(e.path()).expect("vector readable"))
        })
        .collect();
    out.sort();
    out
}

/// The captured Sensu WebSocket payloads, both encodings and the ones a
/// backend rejected (control frames, which are empty, left out), as
/// (relative path, bytes): what agents and the backend's endpoint read.
pub fn sensu_frames() -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = vectors("sensu/protobuf", ".bin")
        .into_iter()
        .chain(vectors("sensu/json", ".bin"))
        .chain(vectors("sensu/rejected", ".bin"))
        .collect();
    v.retain(|(_, b)| !b.is_empty());
    v
}

/// One way to damage an input.
#[derive(Debug, Clone)]
pub enum Mutation {
    /// Flip bit `bit` of the byte at `at` (modulo the length).
    Flip { at: usize, bit: u8 },
    /// Keep only the first `len` bytes (modulo the length + 1).
    Truncate { len: usize },
    /// Insert these bytes at `at`.
    Splice { at: usize, bytes: Vec<u8> },
    /// Overwrite at `at` with a huge length: a 5-byte protobuf varint
    /// (≈4 GiB), a big-endian u32 `0xffff_fff0`, or a WebSocket 64-bit
    /// length marker (`0x7f` + 8 bytes).
    HugeLength { at: usize, form: u8 },
}

impl Mutation {
    /// Applies the mutation to `data`.
    pub fn apply(&self, data: &mut Vec<u8>) {
        match self {
            Mutation::Flip { at, bit } => {
                if !data.is_empty() {
                    let i = at % data.len();
                    data[i] ^= 1 << (bit % 8);
                }
            }
            Mutation::Truncate { len } => {
                let n = len % (data.len() + 1);
                data.truncate(n);
            }
            Mutation::Splice { at, bytes } => {
                let i = at % (data.len() + 1);
                data.splice(i..i, bytes.iter().copied());
            }
            Mutation::HugeLength { at, form } => {
                let huge: &[u8] = match form % 3 {
                    0 => &[0xff, 0xff, 0xff, 0xff, 0x0f],
                    1 => &[0xff, 0xff, 0xff, 0xf0],
                    _ => &[0x7f, 0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                };
                let i = at % (data.len() + 1);
                let end = (i + huge.len()).min(data.len());
                data.splice(i..end, huge.iter().copied());
            }
        }
    }
}

/// A strategy of single mutations.
pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), any::<u8>()).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        any::<usize>().prop_map(|len| Mutation::Truncate { len }),
        (
            any::<usize>(),
            proptest::collection::vec(any::<u8>(), 1..16)
        )
            .prop_map(|(at, bytes)| Mutation::Splice { at, bytes }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, form)| Mutation::HugeLength { at, form }),
    ]
}

/// One of `seeds`, damaged by one to four mutations.
pub fn mutated(seeds: Vec<Vec<u8>>) -> impl Strategy<Value = Vec<u8>> {
    assert!(!seeds.is_empty(), "no seeds to mutate");
    (
        proptest::sample::select(seeds),
        proptest::collection::vec(mutation(), 1..5),
    )
        .prop_map(|(mut data, muts)| {
            for m in &muts {
                m.apply(&mut data);
            }
            data
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_in_bounds() {
        let mut d = vec![1, 2, 3];
        Mutation::Flip { at: 7, bit: 9 }.apply(&mut d);
        assert_eq!(d, [1, 0, 3]);
        Mutation::HugeLength { at: 2, form: 0 }.apply(&mut d);
        assert_eq!(d, [1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        Mutation::Truncate { len: 9 }.apply(&mut d);
        assert_eq!(d.len(), 1);
        let mut e = Vec::new();
        for m in [
            Mutation::Flip { at: 0, bit: 0 },
            Mutation::Truncate { len: 3 },
            Mutation::Splice {
                at: 5,
                bytes: vec![9],
            },
        ] {
            m.apply(&mut e);
        }
        assert_eq!(e, [9]);
        assert!(!vectors("sensu/protobuf", ".bin").is_empty());
    }
}
