//! The production id source: random version-4 UUIDs (ARCHITECTURE §8.12).

use crate::ports::Ids;

/// Random UUIDs from the operating system's randomness.
#[derive(Debug, Clone, Copy, Default)]
pub struct RandomIds;

impl Ids for RandomIds {
    fn next_id(&self) -> String {
        uuid::Uuid::new_v4().to_string()
    }
}
