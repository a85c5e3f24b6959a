//! bash kernel tests (written with the kernel).
