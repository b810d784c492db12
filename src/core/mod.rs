//! The computation, free of the Python binding: a Rust user (or a Rust test) needs nothing else.
//!
//! Dependency order, each module importing only those above it:
//! `error` → `config`, `device` → `kernels`, `direct` → `weights` → `conv` → `seanet`,
//! `quantizer`, `transformer` → `codec`. See ARCHITECTURE.md for what each one owns.

pub mod codec;
pub mod config;
pub mod conv;
pub mod device;
pub mod direct;
pub mod error;
pub mod kernels;
pub mod quantizer;
pub mod seanet;
pub mod transformer;
pub mod weights;

#[cfg(test)]
pub(crate) mod testutil;
