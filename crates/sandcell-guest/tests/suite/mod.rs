mod client;
mod exec;
mod files;
mod handshake;
mod pid1;
mod processes;
mod procs;
