//! Which streaming states a transformer takes: a copy's source ([`Transformer::check_state_source`],
//! the rule `copy_state` checks before anything changes) and a state's buffers
//! ([`Transformer::state_fits`], [`Transformer::fitting`]).

use super::{State, Transformer};
use crate::error::{Error, Result};
use crate::runtime::device::{device_name, dtype_name};

impl Transformer {
    /// Refuses a state copy from `src`, a transformer of another depth
    /// (`DepthMismatch`) or shape, dtype or device (`IncompatibleState`): the rule
    /// `copy_state` checks before anything changes.
    pub fn check_state_source(&self, src: &Transformer) -> Result<()> {
        let (dst_n, src_n) = (self.num_layers(), src.num_layers());
        if dst_n != src_n {
            return Err(Error::DepthMismatch {
                dst: dst_n,
                src: src_n,
            });
        }
        let describe = |t: &Transformer| {
            let c = &t.cfg;
            format!(
                "d_model={}, num_heads={}, context={}, dtype={}, device={}",
                c.d_model,
                c.num_heads,
                c.context,
                dtype_name(t.dtype),
                device_name(&t.device)
            )
        };
        if describe(self) != describe(src) {
            return Err(Error::IncompatibleState(format!(
                "cannot copy the streaming state: the source has {} and this transformer has \
                 {}; build both from the same config, dtype and device",
                describe(src),
                describe(self)
            )));
        }
        Ok(())
    }

    /// `state` if its buffers fit this transformer ([`Self::state_fits`]), else an
    /// `IncompatibleState` error (nothing changes).
    pub fn fitting(&self, state: State) -> Result<State> {
        match self.state_fits(&state) {
            true => Ok(state),
            false => Err(Error::IncompatibleState(
                "cannot copy the streaming state: its buffers do not fit this transformer".into(),
            )),
        }
    }

    /// Whether `state` may be given to this model (same layout of buffers).
    pub fn state_fits(&self, state: &State) -> bool {
        match state.dims() {
            None => true,
            Some((n, dims)) => {
                let c = &self.cfg;
                let same = match state.device_rings().first() {
                    Some(cache) => {
                        !self.planned()
                            && cache.k.dtype() == self.dtype
                            && cache.k.device().same_device(&self.device)
                    }
                    // Host rings: the planned step's alone.
                    None => self.planned(),
                };
                n == self.layers.len()
                    && dims[1..] == [c.num_heads, self.ring_slots, c.head_dim()]
                    && same
            }
        }
    }
}
