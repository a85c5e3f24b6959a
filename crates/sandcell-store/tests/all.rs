//! Integration tests of the metadata store, on real SQLite files in temporary directories.
mod suite;
