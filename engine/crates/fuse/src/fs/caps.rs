//! `security.capability` answered without the store when this mount knows
//! the file has none.
//!
//! Why: the kernel asks FUSE for that xattr before every write(2) to a
//! file (to drop file capabilities from a binary being changed), since a
//! FUSE super block never says its inodes are free of them. For a small
//! file that is one more round trip to an engine per create. The absence
//! is known here for a file this mount just made, or whose xattr it just
//! read as absent; it is trusted for the attribute timeout from then, as
//! the kernel trusts the mode bits it checks for set-user-ID at the same
//! point, and forgotten when this mount sets or removes an xattr of the
//! file. Another client's setxattr of it shows within that bound.

use super::PeregrineFs;
use std::time::Instant;

pub(super) const CAPS_XATTR: &[u8] = b"security.capability";

impl PeregrineFs {
    /// Whether `ino` is known to have no `security.capability`.
    pub(super) fn caps_absent(&self, ino: u64) -> bool {
        let t = self.inodes.lock();
        t.get(&ino)
            .and_then(|i| i.no_caps_since)
            .is_some_and(|s| s.elapsed() < self.opts.attr_ttl)
    }

    /// `ino` had no `security.capability` at `since` (`None`: unknown now).
    pub(super) fn set_caps_absent(&self, ino: u64, since: Option<Instant>) {
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.no_caps_since = since;
        }
    }
}
