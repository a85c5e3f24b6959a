//! Operations: code (being moved here from the server's handlers).
