mod client;
mod exec;
mod files;
mod handshake;
mod kernel_state;
mod pid1;
mod processes;
mod procs;
