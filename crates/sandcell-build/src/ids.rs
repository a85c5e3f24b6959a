//! Private id ranges for build steps: range `k` maps ids 0…65 535 to host ids
//! `FIRST + k·65 536…`, far above any user a host has. A build holds one range (a file lock)
//! for its whole life, so two builds at once never share ids.

use std::fs::{self, File};
use std::path::Path;

use sandcell_jail::build::ID_RANGE_SIZE;

use crate::BuildError;

/// Host id of id 0 of range 0.
pub const FIRST: u32 = 1_000_000;

/// Ranges there are (so many builds may run at once on one host).
pub const RANGES: u32 = 256;

/// A range held until dropped.
#[derive(Debug)]
pub struct IdLease {
    base: u32,
    _lock: File,
}

impl IdLease {
    /// Takes the first free range, its lock file kept in `dir`.
    pub fn take(dir: &Path) -> Result<Self, BuildError> {
        fs::create_dir_all(dir).map_err(BuildError::io(format!("create {}", dir.display())))?;
        for k in 0..RANGES {
            let path = dir.join(format!("{k}.lock"));
            let file = File::options()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(BuildError::io(format!("open {}", path.display())))?;
            match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {
                    return Ok(Self {
                        base: FIRST + k * ID_RANGE_SIZE,
                        _lock: file,
                    });
                }
                Err(rustix::io::Errno::WOULDBLOCK) => continue,
                Err(e) => {
                    return Err(BuildError::io(format!("lock {}", path.display()))(e.into()));
                }
            }
        }
        Err(BuildError::Busy(format!(
            "all {RANGES} id ranges are held by running builds"
        )))
    }

    /// The host id of id 0.
    pub fn base(&self) -> u32 {
        self.base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_builds_at_once_get_different_ranges_and_a_released_one_is_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let a = IdLease::take(dir.path()).unwrap();
        let b = IdLease::take(dir.path()).unwrap();
        assert_eq!(a.base(), FIRST);
        assert_eq!(b.base(), FIRST + ID_RANGE_SIZE);
        drop(a);
        let c = IdLease::take(dir.path()).unwrap();
        assert_eq!(c.base(), FIRST);
    }
}
