//! The transformer itself ([`Transformer`]): its weights and shapes, how it is built, and its
//! calls: the checks, the forward entries, the start of a stream. The block path
//! ([`super::block`]) and the planned step ([`super::step`]) compute them.

use super::layer::Layer;
use super::positions::ring_slots;
use super::state::{HostRings, LayerCache, Rings, State};
use super::step_buffers::{HostRing, Workspace};
use crate::config::TransformerConfig;
use crate::error::{Cancel, Error, Result};
use crate::host::{CheckedShape, HostArray, HostInput};
use crate::kernels::in_pool_on;
use crate::rows::Rows;
use crate::runtime::device::cast;
use crate::runtime::precision::Precision;
use candle::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use std::collections::{BTreeMap, HashMap};

/// Weights and shapes of a transformer; immutable once built.
pub struct Transformer {
    pub(super) cfg: TransformerConfig,
    pub(super) layers: Vec<Layer>,
    pub(super) device: Device,
    pub(super) dtype: DType,
    /// The weights the layers do not hold packed (norms, biases, layer scales; every matrix
    /// off the CPU), under their checkpoint names.
    pub(super) weights: BTreeMap<String, Tensor>,
    /// Whether the candle path steps in fixed shapes (`fixed.rs`; `MIMI_PY_FIXED_STEP`).
    pub(super) fixed_step: bool,
    /// Whether fixed-shape steps run as each stream's graph plan says (`MIMI_PY_CUDA_GRAPHS`).
    pub(super) graphs: bool,
    /// Slots of each ring: `context` on the planned step's host rings, `fixed::ring_slots`
    /// on the candle path's. Every ring keeps position `p` in slot `p % ring_slots`.
    pub(super) ring_slots: usize,
    /// Its identity in the input shapes it checks ([`CheckedShape`]).
    pub(super) id: u64,
}

impl Transformer {
    /// Reads this transformer's weights from `src` (as `spec` says),
    /// refusing any problem, and builds it.
    pub fn load(
        cfg: &TransformerConfig,
        src: &crate::weights::TensorSource,
        spec: &crate::weights::LoadSpec,
    ) -> crate::error::Result<Self> {
        cfg.check_supported()?;
        let params = crate::weights::transformer_params(cfg);
        crate::weights::check_load_memory(
            params,
            &format!("a transformer with {params} parameters"),
            "check the config's sizes",
        )?;
        let w = crate::weights::load_transformer_only(cfg, src, spec)?;
        let mut model = Self::new(cfg, w, spec.device, spec.dtype)?;
        if spec.precision == Precision::Medium {
            model.pair_pack();
        }
        // Loading freed every matrix it packed: give those pages back.
        crate::runtime::memory::trim_heap();
        Ok(model)
    }

    /// Builds the model from checked weights (names without prefix, interleaved q/k layout,
    /// already in `dtype` on `device`, the matrices possibly in bf16 for an f32 model on the
    /// CPU: see [`crate::weights::LoadSpec::precision`]).
    pub fn new(
        cfg: &TransformerConfig,
        weights: BTreeMap<String, Tensor>,
        device: &Device,
        dtype: DType,
    ) -> Result<Self> {
        let map: HashMap<String, Tensor> = weights
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let vb = VarBuilder::from_tensors(map, dtype, device);
        let stored = weights.values().find(|t| t.rank() == 2).map(|t| t.dtype());
        let vbw = match stored {
            Some(DType::BF16) if dtype == DType::F32 && device.is_cpu() => {
                vb.clone().set_dtype(DType::BF16)
            }
            _ => vb.clone(),
        };
        let layers = (0..cfg.num_layers)
            .map(|i| Layer::load(cfg, vb.pp("layers").pp(i), vbw.pp("layers").pp(i)))
            .collect::<Result<Vec<_>>>()?;
        drop(vb);
        drop(vbw);
        // A packed matrix is the layer's only copy: the row-major one is let go.
        let mut weights = weights;
        for (i, layer) in layers.iter().enumerate() {
            for (linear, names) in layer.linears() {
                if linear.is_packed() {
                    names
                        .iter()
                        .for_each(|n| _ = weights.remove(&format!("layers.{i}.{n}")));
                }
            }
        }
        // On a GPU the weights were queued on this thread's stream: wait for them (see
        // `kernels::in_pool_on`).
        device.synchronize()?;
        let planned = layers.iter().all(|l| l.host.is_some());
        let fixed_step = !planned && crate::runtime::settings::get().fixed_step;
        Ok(Self {
            cfg: cfg.clone(),
            layers,
            device: device.clone(),
            dtype,
            weights,
            fixed_step,
            graphs: crate::runtime::settings::get().cuda_graphs,
            ring_slots: ring_slots(cfg.context, fixed_step),
            id: crate::host::owner_id(),
        })
    }

    pub fn config(&self) -> &TransformerConfig {
        &self.cfg
    }

    /// This model with the fixed-shape steps' graph plan on or off, whatever
    /// `MIMI_PY_CUDA_GRAPHS` says (tests compare the two in one process).
    #[cfg(test)]
    pub(crate) fn with_graphs(mut self, on: bool) -> Self {
        self.graphs = on;
        self
    }

    /// This model with the candle path's fixed-shape step on or off, whatever
    /// `MIMI_PY_FIXED_STEP` says (tests compare the two in one process).
    #[cfg(test)]
    pub(crate) fn with_fixed_step(mut self, on: bool) -> Self {
        self.fixed_step = on && !self.planned();
        self.ring_slots = ring_slots(self.cfg.context, self.fixed_step);
        self
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// How the linear layers compute (below `"highest"` only for an f32 model on the CPU).
    pub fn precision(&self) -> Precision {
        let first = self.layers.first().map(|l| &l.attn.qkv);
        match first.map(|l| (l.is_pairs(), l.weight_dtype())) {
            Some((true, _)) => Precision::Medium,
            Some((false, DType::BF16)) if self.dtype == DType::F32 => Precision::High,
            _ => Precision::Highest,
        }
    }

    /// Holds the linear layers' matrices in bf16 pairs (`precision="medium"`): the packed
    /// ones; a model off the CPU keeps candle's.
    pub fn pair_pack(&mut self) {
        self.layers.iter_mut().for_each(Layer::pair_pack);
    }

    /// [`Self::weights`] as f32 host arrays.
    pub fn weights_host(&self) -> Result<BTreeMap<String, crate::host::HostArray<f32>>> {
        (self.weights()?.into_iter())
            .map(|(k, t)| {
                let data = cast(&t, DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                Ok((k, crate::host::HostArray::new(data, t.dims().to_vec())))
            })
            .collect()
    }

    /// The weights under their checkpoint names (no prefix, interleaved q/k layout), in their
    /// stored dtypes; the packed matrices are unpacked (a copy).
    pub fn weights(&self) -> Result<BTreeMap<String, Tensor>> {
        let mut out = self.weights.clone();
        for (i, layer) in self.layers.iter().enumerate() {
            for (linear, names) in layer.linears().into_iter().filter(|(l, _)| l.is_packed()) {
                let w = linear.weight()?;
                let rows = w.dim(0)? / names.len();
                for (j, n) in names.iter().enumerate() {
                    out.insert(format!("layers.{i}.{n}"), w.narrow(0, j * rows, rows)?);
                }
            }
        }
        Ok(out)
    }

    /// Bytes of the weights one step reads, as stored (the matrices in their weights dtype).
    pub fn weights_nbytes(&self) -> usize {
        let held: usize = (self.weights.values())
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum();
        let packed: usize = (self.layers.iter().flat_map(Layer::linears))
            .filter(|(l, _)| l.is_packed())
            .map(|(l, _)| l.weight_nbytes())
            .sum();
        held + packed
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// The one entry on tensors (the codec's stages, the tests): `xs` (n, time, d_model) for
    /// the stream's rows `rows` (`None`: all of them, n = the batch), each continuing its own
    /// stream; the other rows are untouched. Stops between blocks once `cancel` is set.
    /// Refuses another shape, or a batch other than the stream's, before anything changes.
    pub(crate) fn forward(
        &self,
        state: &mut State,
        xs: &Tensor,
        rows: Option<&Rows>,
        cancel: Cancel,
    ) -> Result<Tensor> {
        match rows.filter(|r| r.is_masked()) {
            None => {
                self.check_input(xs.dims())?;
                self.check_batch(state, xs.dim(0)?)?;
                crate::kernels::in_pool_on(&self.device, || self.forward_all(state, xs, cancel))
            }
            Some(r) => {
                self.check_batch(state, r.batch())?;
                self.start(state, r.batch())?;
                self.forward_rows(state, xs, &r.indices())
            }
        }
    }

    /// Refuses an input that is not `(batch >= 1, time, d_model)`.
    pub fn check_input(&self, shape: &[usize]) -> Result<()> {
        let d = self.cfg.d_model;
        if shape.len() != 3 || shape[2] != d || shape[0] == 0 {
            return Err(Error::Shape(format!(
                "expected an input of shape (batch, time, d_model={d}) with batch >= 1, got {shape:?}"
            )));
        }
        Ok(())
    }

    /// Every rule of a host call's input shape: [`Self::check_input`], its size, and the
    /// memory the call needs ([`Self::call_memory`]). A binding calls it while it still holds
    /// the caller's array, and hands the result back with the values to [`Self::forward_host`].
    pub fn check_call(&self, shape: &[usize]) -> Result<CheckedShape> {
        self.check_shape(shape)?;
        Ok(CheckedShape::new(shape.to_vec(), (self.id, 0)))
    }

    /// The rules of [`Self::check_call`] (counted, for the test that a call checks once).
    fn check_shape(&self, shape: &[usize]) -> Result<()> {
        crate::runtime::profile::shape_checked();
        self.check_input(shape)?;
        crate::host::check_size(shape, "x")?;
        crate::host::check_batch_size(shape[0], "x")?;
        crate::runtime::memory::check_memory(
            self.call_memory(shape),
            "this call",
            "split the input into shorter chunks (results do not depend on chunking)",
        )
    }

    /// Refuses an input of `b` rows for a stream that holds another batch size.
    pub fn check_batch(&self, state: &State, b: usize) -> Result<()> {
        match state.batch() {
            Some(sb) if sb != b => Err(Error::Shape(format!(
                "this stream holds state for batch size {sb}, got an input of batch size {b}; \
                 call reset_state() before streaming another batch size"
            ))),
            _ => Ok(()),
        }
    }

    /// Bytes a call on `(b, t, d)` needs: input copy, tensor, output and its copy (4 x 4
    /// bytes) plus the activations of one block.
    pub fn call_memory(&self, shape: &[usize]) -> u64 {
        let cfg = &self.cfg;
        let (b, t, d) = (shape[0] as u64, shape[1] as u64, shape[2] as u64);
        let block = (cfg.context.max(64) as u64).min(t);
        let heads = cfg.num_heads as u64;
        (16 * b).saturating_mul(t).saturating_mul(d).saturating_add(
            (4 * b)
                .saturating_mul(block)
                .saturating_mul(16 * d + 3 * heads * (block + cfg.context as u64)),
        )
    }

    /// One call on a host array `(b, t, d_model)`: all rows, or only the active `rows` (the
    /// others keep their state bit for bit and their output is zeros). A model that takes
    /// the planned step computes it on the host values ([`Self::step_host`], in the caller's
    /// workspace `ws`, which a stream keeps beside its state); the others on tensors
    /// ([`Self::forward`]).
    pub fn forward_host(
        &self,
        (state, ws): (&mut State, &mut Workspace),
        x: impl Into<HostInput<f32>>,
        rows: Option<Rows>,
    ) -> Result<HostArray<f32>> {
        let x = x
            .into()
            .resolve((self.id, 0), "x", |shape| self.check_shape(shape))?;
        let (b, t, d) = (x.shape[0], x.shape[1], x.shape[2]);
        self.check_batch(state, b)?;
        let rows = Rows::or_all(rows, b)?;
        let stepping = rows.is_masked().then(|| rows.indices());
        crate::host::check_finite(&x.data, &x.shape, stepping.as_deref(), "x")?;
        // A masked call binds the stream to its batch size even when nothing steps; an empty
        // call of every row does not.
        if rows.is_masked() {
            self.start(state, b)?;
        }
        if rows.count() == 0 || t == 0 {
            return Ok(HostArray::new(vec![0.0; b * t * d], x.shape));
        }
        self.start(state, b)?;
        let xs = match rows.is_masked() {
            true => rows.select(&x.data, t * d),
            false => x.data,
        };
        let ys = if self.planned() {
            let mut out = vec![0.0; xs.len()];
            in_pool_on(&self.device, || {
                self.step_host(state, ws, &xs, &rows.indices(), &mut out, None)
            })?;
            out
        } else {
            let xs = cast(
                &Tensor::from_vec(xs, (rows.count(), t, d), &self.device)?,
                self.dtype,
            )?;
            let ys = self.forward(state, &xs, Some(&rows), None)?;
            cast(&ys, DType::F32)?.flatten_all()?.to_vec1::<f32>()?
        };
        let out = match rows.is_masked() {
            true => rows.scatter(ys, t * d),
            false => ys,
        };
        Ok(HostArray::new(out, vec![b, t, d]))
    }

    /// Runs `xs` (rows.len(), time, d_model) for the batch rows `rows` only (sorted, distinct,
    /// below the batch size), each continuing its own stream; the other rows are untouched.
    fn forward_rows(&self, state: &mut State, xs: &Tensor, rows: &[usize]) -> Result<Tensor> {
        crate::kernels::in_pool_on(&self.device, || {
            let (b, t, _) = xs.dims3()?;
            if t == 0 || b == 0 {
                return Ok(xs.clone());
            }
            match state.batch() {
                Some(batch) if rows.len() == batch => self.forward_all(state, xs, None),
                Some(_) => self.uneven(state, xs, rows, None),
                None => Err(Error::Internal(
                    "forward_rows needs a started stream".into(),
                )),
            }
        })
    }

    /// Whether this model takes the planned step, and so [`Self::step_host`] (an f32 model
    /// on the CPU with the plain feed-forward block).
    pub fn takes_host_step(&self) -> bool {
        self.planned()
    }

    /// Allocates the buffers for batch size `b` at the first call (no-op afterwards).
    pub fn start(&self, state: &mut State, b: usize) -> Result<()> {
        if state.batch().is_some() {
            return Ok(());
        }
        let c = &self.cfg;
        if self.planned() {
            let dims = vec![b, c.num_heads, c.context, c.head_dim()];
            let ring = HostRing::zeros(dims.iter().product());
            state.rings = Rings::Host(HostRings {
                layers: vec![ring; self.layers.len()],
                dims,
            });
            state.pos = vec![0; b];
            return Ok(());
        }
        let shape = (b, c.num_heads, self.ring_slots, c.head_dim());
        let caches = (0..self.layers.len())
            .map(|_| {
                Ok(LayerCache {
                    k: Tensor::zeros(shape, self.dtype, &self.device)?,
                    v: Tensor::zeros(shape, self.dtype, &self.device)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        state.rings = Rings::Device(caches);
        state.pos = vec![0; b];
        Ok(())
    }

    /// Every row of the stream, stopping between blocks of `block_len` steps once `cancel` is
    /// set.
    fn forward_all(
        &self,
        state: &mut State,
        xs: &Tensor,
        cancel: Option<&std::sync::atomic::AtomicBool>,
    ) -> Result<Tensor> {
        let (b, t, _) = xs.dims3()?;
        if t == 0 {
            return Ok(xs.clone());
        }
        self.start(state, b)?;
        if self.planned() {
            let rows: Vec<usize> = (0..b).collect();
            return self.step_rows(state, xs, &rows, cancel);
        }
        let pos = state.pos[0];
        if state.pos.iter().any(|&p| p != pos) {
            let rows: Vec<usize> = (0..b).collect();
            return self.uneven(state, xs, &rows, cancel);
        }
        let ys = self.blocks(pos, state, xs, cancel)?;
        state.pos.iter_mut().for_each(|p| *p += t as u64);
        Ok(ys)
    }
}
