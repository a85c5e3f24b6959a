mod bash;
mod host_calls;
mod node;
mod python;
mod r;
mod state;
