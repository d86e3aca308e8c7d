//! A cheap scan of a protobuf message's top-level fields, shared by the
//! protocol crates to count fields a peer sent that agent-sim does not know
//! (prost skips them silently). It reads each top-level key and skips its
//! value without decoding or allocating: tens of nanoseconds for the
//! messages agents receive.

/// Scans the top-level fields of a protobuf message: the first field whose
/// number is not in `known` (number, wire type) and how many such fields.
/// Stops quietly at the first malformed key or value (the decoder reports
/// those).
pub fn unknown_fields(body: &[u8], known: &[u32]) -> Option<(u32, u8, usize)> {
    fn varint(b: &[u8], i: &mut usize) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *b.get(*i)?;
            *i += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Some(v);
            }
        }
        None
    }
    let mut first = None;
    let mut count = 0;
    let mut i = 0;
    while i < body.len() {
        let Some(key) = varint(body, &mut i) else {
            break;
        };
        let number = u32::try_from(key >> 3).unwrap_or(u32::MAX);
        let wire = (key & 7) as u8;
        let skip = match wire {
            0 => varint(body, &mut i).map(|_| 0),
            1 => Some(8),
            2 => varint(body, &mut i).and_then(|l| usize::try_from(l).ok()),
            5 => Some(4),
            _ => None, // groups (3, 4) are not used by proto3; 6, 7 are invalid
        };
        if !known.contains(&number) {
            count += 1;
            first.get_or_insert((number, wire));
        }
        match skip.and_then(|n| i.checked_add(n)) {
            Some(next) if next <= body.len() => i = next,
            _ => break,
        }
    }
    first.map(|(n, w)| (n, w, count))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_unknown_field_and_counts_them() {
        // 1: varint 5, 2: "hi", 9: fixed64, 10: fixed32, 11: varint
        let body = [
            0x08, 0x05, 0x12, 0x02, b'h', b'i', 0x49, 0, 0, 0, 0, 0, 0, 0, 0, 0x55, 0, 0, 0, 0,
            0x58, 0x01,
        ];
        assert_eq!(unknown_fields(&body, &[1, 2, 9, 10, 11]), None);
        assert_eq!(unknown_fields(&body, &[1, 2]), Some((9, 1, 3)));
        // Malformed: a length past the end stops the scan, no panic.
        assert_eq!(unknown_fields(&[0x12, 0x7f, 0x00], &[]), Some((2, 2, 1)));
        assert_eq!(unknown_fields(&[0xff; 12], &[]), None);
        assert_eq!(unknown_fields(&[], &[]), None);
    }
}
