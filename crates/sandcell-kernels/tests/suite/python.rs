//! python kernel tests (written with the kernel).
