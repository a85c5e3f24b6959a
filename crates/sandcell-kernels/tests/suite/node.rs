//! node kernel tests (written with the kernel).
