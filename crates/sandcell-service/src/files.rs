//! Operations: files (being moved here from the server's handlers).
