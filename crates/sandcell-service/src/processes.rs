//! Operations: processes (being moved here from the server's handlers).
