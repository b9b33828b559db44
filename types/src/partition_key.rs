//! The Event Hubs partition-key hash (SPEC.md section 2).
//!
//! This must match the service and the .NET SDK's `PartitionResolver` bit for bit: a client
//! that routes by key on its own and a broker that routes for it must pick the same partition,
//! or per-key ordering silently breaks. Hence the exact lookup3 variant, the `i16` truncation
//! and the truncated (not floored) remainder below.

/// Hashes a partition key the way Event Hubs does: Jenkins lookup3 `hashlittle2` over the
/// key's UTF-8 bytes, then the low 16 bits of `hash1 ^ hash2`, read as signed.
pub fn partition_key_hash(key: &str) -> i16 {
    let (hash1, hash2) = hashlittle2(key.as_bytes());
    (hash1 ^ hash2) as u16 as i16
}

/// Maps a partition key onto a partition index in `0..partition_count`.
///
/// Uses the truncated remainder and its absolute value, as C# `Math.Abs(h % n)` does; a
/// floored modulo (Python's `%`) would send negative hashes elsewhere.
///
/// # Panics
///
/// If `partition_count` is 0: a hub always has at least one partition, so that is a bug in
/// the caller.
pub fn partition_for_key(key: &str, partition_count: u16) -> u16 {
    assert!(partition_count > 0, "a hub has at least one partition");
    // Widen first: `i16::MIN % n` may not fit back into an `i16` for large `n`.
    let rem = i32::from(partition_key_hash(key)) % i32::from(partition_count);
    rem.unsigned_abs() as u16
}

/// lookup3 `hashlittle2` with both seeds 0; returns `(c, b)`, i.e. `(hash1, hash2)`.
///
/// Reading blocks as little-endian words makes it the same on every platform, which is what
/// the service's implementation computes.
fn hashlittle2(bytes: &[u8]) -> (u32, u32) {
    // lookup3 adds the length as a `uint32_t`, so it wraps for huge inputs; so do we.
    let init = 0xDEAD_BEEF_u32.wrapping_add(bytes.len() as u32);
    let (mut a, mut b, mut c) = (init, init, init);
    if bytes.is_empty() {
        return (c, b);
    }

    let mut rest = bytes;
    // Only while MORE than 12 bytes remain: the last block, even a full one, goes to `final`.
    while rest.len() > 12 {
        let (block, tail) = rest.split_at(12);
        a = a.wrapping_add(le_word(&block[0..4]));
        b = b.wrapping_add(le_word(&block[4..8]));
        c = c.wrapping_add(le_word(&block[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = tail;
    }

    let mut last = [0u8; 12];
    last[..rest.len()].copy_from_slice(rest);
    a = a.wrapping_add(le_word(&last[0..4]));
    b = b.wrapping_add(le_word(&last[4..8]));
    c = c.wrapping_add(le_word(&last[8..12]));
    final_mix(&mut a, &mut b, &mut c);
    (c, b)
}

fn le_word(bytes: &[u8]) -> u32 {
    u32::from_le_bytes(bytes.try_into().expect("callers pass exactly 4 bytes"))
}

/// lookup3 `mix`: rotations 4, 6, 8, 16, 19, 4.
fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c) ^ c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a) ^ a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b) ^ b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c) ^ c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a) ^ a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b) ^ b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

/// lookup3 `final`: rotations 14, 11, 25, 16, 4, 14, 24.
fn final_mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(14));
    *a = (*a ^ *c).wrapping_sub(c.rotate_left(11));
    *b = (*b ^ *a).wrapping_sub(a.rotate_left(25));
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(16));
    *a = (*a ^ *c).wrapping_sub(c.rotate_left(4));
    *b = (*b ^ *a).wrapping_sub(a.rotate_left(14));
    *c = (*c ^ *b).wrapping_sub(b.rotate_left(24));
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// (key, h, index for N=4, index for N=32). The first six rows are SPEC.md's table; the
    /// rest (block-boundary lengths 12, 13, 24, 25 and non-ASCII keys) were computed with
    /// Bob Jenkins' reference lookup3.c (byte-wise path) compiled from C.
    const VECTORS: &[(&str, i16, u16, u16)] = &[
        ("a", -16220, 0, 28),
        ("hello", 2839, 3, 23),
        ("partition-key-1", -17070, 2, 14),
        ("device-42", -21548, 0, 12),
        ("0123456789abc", -4167, 3, 7),
        ("", 0, 0, 0),
        ("0123456789ab", -17054, 2, 30),
        ("0123456789ab0123456789ab", 24499, 3, 19),
        ("0123456789ab0123456789abc", -29417, 1, 9),
        ("héllo", 17041, 1, 17),
        ("日本語キー", 13593, 1, 25),
        ("🦀🦀🦀", -5754, 2, 26),
    ];

    #[test]
    fn matches_known_vectors() {
        for &(key, h, n4, n32) in VECTORS {
            assert_eq!(partition_key_hash(key), h, "hash of {key:?}");
            assert_eq!(partition_for_key(key, 4), n4, "N=4 for {key:?}");
            assert_eq!(partition_for_key(key, 32), n32, "N=32 for {key:?}");
        }
    }

    #[test]
    fn matches_lookup3_reference_value() {
        // hashlittle(key, 0) is hashlittle2's first output with both seeds 0.
        let (hash1, _) = hashlittle2(b"Four score and seven years ago");
        assert_eq!(hash1, 0x1777_0551);
    }

    #[test]
    fn empty_key_skips_final() {
        assert_eq!(hashlittle2(b""), (0xDEAD_BEEF, 0xDEAD_BEEF));
    }

    #[test]
    #[should_panic(expected = "at least one partition")]
    fn zero_partitions_is_a_bug() {
        partition_for_key("a", 0);
    }

    proptest! {
        #[test]
        fn index_is_in_range_and_deterministic(key in any::<String>(), n in 1..=u16::MAX) {
            let index = partition_for_key(&key, n);
            prop_assert!(index < n);
            prop_assert_eq!(index, partition_for_key(&key, n));
        }
    }
}
