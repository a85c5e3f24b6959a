mod bash;
mod node;
mod python;
mod r;
mod state;
