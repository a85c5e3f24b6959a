//! Operations: exec (being moved here from the server's handlers).
