mod attacks;
mod cli;
mod common;
mod exec;
mod files;
mod kernels;
mod limits;
mod rootless;
