//! Operations: keys (being moved here from the server's handlers).
