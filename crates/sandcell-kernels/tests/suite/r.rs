//! r kernel tests (written with the kernel).
