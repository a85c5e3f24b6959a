//! Mutex locking shared by every module (a leaf: it imports nothing from the crate).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex, recovering the data if a panicking holder poisoned it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
