//! A seeded id source: the same seed gives the same ids in the same order, so a simulation
//! replays bit for bit (ARCHITECTURE §8.12). Production uses [`crate::aws::ids::RandomIds`].

use std::sync::atomic::{AtomicU64, Ordering};

use crate::ports::Ids;

/// UUID-shaped ids from a seed and a counter.
#[derive(Debug, Default)]
pub struct SeededIds {
    seed: u64,
    next: AtomicU64,
}

impl SeededIds {
    pub fn new(seed: u64) -> SeededIds {
        SeededIds {
            seed,
            next: AtomicU64::new(0),
        }
    }
}

/// SplitMix64's output for state `z`: a well-mixed 64-bit step, enough for ids that must only
/// be distinct and reproducible, and for a seeded test's choices. The next state is
/// `z + 0x9E37_79B9_7F4A_7C15`.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Ids for SeededIds {
    fn next_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let hi = mix(self.seed ^ mix(n));
        let lo = mix(hi ^ n.rotate_left(17));
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&hi.to_be_bytes());
        bytes[8..].copy_from_slice(&lo.to_be_bytes());
        uuid::Builder::from_random_bytes(bytes)
            .into_uuid()
            .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_distinct_ids_and_another_seed_others() {
        let take = |seed| {
            let ids = SeededIds::new(seed);
            (0..100).map(|_| ids.next_id()).collect::<Vec<_>>()
        };
        let (a, b, c) = (take(7), take(7), take(8));
        assert_eq!(a, b);
        assert_ne!(a, c);
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert_eq!(distinct.len(), 100);
        assert!(uuid::Uuid::parse_str(&a[0]).is_ok());
    }
}
