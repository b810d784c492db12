//! What the process provides: devices and dtypes, memory (estimates, resident size, the
//! working-memory policy), and the environment switches ([`settings`]).

pub mod device;
pub mod memory;
pub mod settings;
