//! What the process provides: devices and dtypes, memory (estimates, resident size, the
//! working-memory policy), the environment switches ([`settings`]), and the per-layer
//! timers benchmarks turn on ([`profile`]).

pub mod device;
pub mod memory;
pub mod precision;
pub mod profile;
pub mod settings;
