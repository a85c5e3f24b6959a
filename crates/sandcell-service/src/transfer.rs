//! Operations: transfer (being moved here from the server's handlers).
