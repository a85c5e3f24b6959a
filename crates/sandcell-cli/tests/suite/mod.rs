mod attacks;
mod cli;
mod common;
mod exec;
mod files;
mod limits;
mod rootless;
