//! The Python boundary: the `#[pyclass]` types (`PyX` in Rust, `X` in Python), argument
//! parsing, numpy conversion, the exception mapping, and the guard every call goes through.
//! Nothing here computes; everything here is about Python.

pub mod codec;
pub mod config;
pub mod convert;
pub mod errors;
pub mod guard;
pub mod row_args;
pub mod transformer;
pub mod weights;
