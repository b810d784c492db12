//! CUDA graphs for streaming steps (`MIMI_PY_CUDA_GRAPHS`): a step whose shapes repeat is
//! captured once and replayed after, so a frame costs one launch instead of hundreds.
//!
//! A graph bakes in every address it touches, so what it reads and writes must stay put: the
//! weights (immutable), the stream's rings (written in place), and the step's inputs and
//! output, which live in fixed buffers its owner allocates before the capture
//! ([`Graphs::entry`]). What changes from step to step (the input, positions, write slots,
//! masks, the stepping rows) is written into those buffers before each replay, outside the
//! graph; the temporaries a captured step makes come from stream-ordered allocations, which a
//! capture turns into the graph's own memory nodes, freed inside it.
//!
//! The plan ([`GraphPlan`]) is device-independent: a shape runs eagerly for its first
//! [`WARMUP_STEPS`] steps (libraries load their kernels and workspaces lazily, which a capture
//! may not do), is captured at the next, and replayed from then on; a capture that fails
//! leaves that shape eager for good. On a device without graphs (the CPU), the same plan runs
//! with a capture-free recorder ([`record`], [`replay`] run the step eagerly over the same
//! fixed buffers), which is how the CPU tests check the plan, the tables and the in-place
//! state, bit for bit against ordinary steps.

use crate::error::{Error, Result};
use candle::{DType, Device, TensorId};
use std::sync::atomic::{AtomicU64, Ordering};

/// Eager steps of a shape before it is captured.
pub const WARMUP_STEPS: u32 = 1;
/// Shapes a stream keeps graphs for; the least recently used is dropped beyond.
pub const MAX_GRAPHS: usize = 8;

/// What identifies a graph: the step's shapes and the rings it writes (new rings, after a
/// full reset or a copy, are a new graph).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GraphKey {
    /// Rows of the stream.
    pub batch: usize,
    /// Rows that step.
    pub rows: usize,
    /// Tokens per row.
    pub tokens: usize,
    /// The model's dtype.
    pub dtype: DType,
    /// The first ring's tensor: the state the graph writes.
    pub rings: TensorId,
}

/// What a step does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Run the ordinary (eager) step.
    Eager,
    /// Capture this step into a graph (then run it).
    Capture,
    /// Write the inputs and replay the captured graph.
    Replay,
}

/// A shape's state in the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    Warming(u32),
    Captured,
    Failed,
}

/// Which steps are captured, replayed or run eagerly, per shape; least recently used first.
#[derive(Clone, Debug, Default)]
pub struct GraphPlan {
    shapes: Vec<(GraphKey, Stage)>,
}

impl GraphPlan {
    /// The action for a step of shape `key` (and counts it as used).
    pub fn decide(&mut self, key: GraphKey) -> Action {
        let stage = match self.shapes.iter().position(|(k, _)| *k == key) {
            Some(i) => self.shapes.remove(i).1,
            None => Stage::Warming(0),
        };
        let (stage, action) = match stage {
            Stage::Warming(n) if n < WARMUP_STEPS => (Stage::Warming(n + 1), Action::Eager),
            Stage::Warming(_) => (Stage::Warming(WARMUP_STEPS), Action::Capture),
            Stage::Captured => (Stage::Captured, Action::Replay),
            Stage::Failed => (Stage::Failed, Action::Eager),
        };
        self.shapes.push((key, stage));
        if self.shapes.len() > MAX_GRAPHS {
            self.shapes.remove(0);
        }
        action
    }

    /// Records how the capture of `key` went: replayed from now on, or eager for good.
    pub fn captured(&mut self, key: GraphKey, ok: bool) {
        if let Some((_, s)) = self.shapes.iter_mut().find(|(k, _)| *k == key) {
            *s = if ok { Stage::Captured } else { Stage::Failed };
        }
    }

    /// The shapes the plan keeps (most recent last).
    pub fn keys(&self) -> impl Iterator<Item = GraphKey> + '_ {
        self.shapes.iter().map(|(k, _)| *k)
    }
}

/// A stream's graphs: the plan and, per captured shape, its owner's fixed buffers `B` with the
/// recording. A copy of a stream starts with none (its rings are new buffers).
pub struct Graphs<B> {
    plan: GraphPlan,
    entries: Vec<(GraphKey, B, Recorded)>,
}

impl<B> Default for Graphs<B> {
    fn default() -> Self {
        Self {
            plan: GraphPlan::default(),
            entries: Vec::new(),
        }
    }
}

impl<B> Clone for Graphs<B> {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl<B> Graphs<B> {
    /// The action for a step of shape `key`; drops the recordings of shapes the plan forgot.
    pub fn decide(&mut self, key: GraphKey) -> Action {
        let action = self.plan.decide(key);
        let kept: Vec<GraphKey> = self.plan.keys().collect();
        self.entries.retain(|(k, _, _)| kept.contains(k));
        count(action);
        action
    }

    /// Captures a step of shape `key`: `make` allocates the fixed buffers holding this step's
    /// inputs (outside the capture), `step` is what the graph records and then runs. Returns the buffers (their output holds the step's result), or `None`
    /// when the capture failed: the shape runs eagerly from then on and nothing was run (a
    /// capture-free recorder's error is the step's own, returned).
    pub fn capture(
        &mut self,
        dev: &Device,
        key: GraphKey,
        make: impl FnOnce() -> Result<B>,
        step: impl Fn(&B) -> Result<()>,
    ) -> Result<Option<&B>> {
        let bufs = make()?;
        let recorded = record(dev, || step(&bufs))?;
        self.plan.captured(key, recorded.is_some());
        let Some(recorded) = recorded else {
            COUNTS[FAILED].fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        };
        if recorded.graph.is_some() {
            replay(dev, &recorded, || Ok(()))?;
        }
        self.entries.push((key, bufs, recorded));
        Ok(self.entries.last().map(|(_, b, _)| b))
    }

    /// Replays the step of shape `key` after `fill` wrote its inputs; `step` runs it where
    /// there is no graph (the capture-free recorder). Returns the buffers.
    pub fn replay(
        &self,
        dev: &Device,
        key: GraphKey,
        fill: impl FnOnce(&B) -> Result<()>,
        step: impl FnOnce(&B) -> Result<()>,
    ) -> Result<&B> {
        let Some((_, bufs, recorded)) = self.entries.iter().find(|(k, _, _)| *k == key) else {
            return Err(Error::Internal(format!("no graph recorded for {key:?}")));
        };
        fill(bufs)?;
        replay(dev, recorded, || step(bufs))?;
        Ok(bufs)
    }
}

/// A recorded step: a CUDA graph, or nothing (the capture-free recorder, which runs the step
/// again at each replay).
pub struct Recorded {
    graph: Option<cuda::Graph>,
}

/// Records `step` on `dev`: a CUDA graph captured on the calling thread's stream (nothing
/// runs until the graph is launched; `None` when the capture failed, and then nothing ran),
/// or on other devices the step run once (its error is the step's).
pub fn record(dev: &Device, step: impl FnOnce() -> Result<()>) -> Result<Option<Recorded>> {
    match dev {
        #[cfg(feature = "cuda")]
        Device::Cuda(cuda) => Ok(cuda::capture(cuda, step)
            .ok()
            .map(|g| Recorded { graph: Some(g) })),
        _ => {
            step()?;
            Ok(Some(Recorded { graph: None }))
        }
    }
}

/// Runs a recorded step again: launches its graph on the calling thread's stream, or runs
/// `step` where there is none.
pub fn replay(dev: &Device, recorded: &Recorded, step: impl FnOnce() -> Result<()>) -> Result<()> {
    match &recorded.graph {
        Some(graph) => cuda::launch(dev, graph),
        None => step(),
    }
}

/// Runs `f` with candle's small host-to-device copies of kernel parameters (the shapes and
/// strides its strided kernels take) served from its cache: a warm-up step fills the cache, so
/// the capture that follows makes no copy from the host (which a capture may not). Only the
/// step runs under it, never an upload of data (the cache would keep every table it saw).
pub fn with_param_cache<T>(dev: &Device, f: impl FnOnce() -> T) -> T {
    #[cfg(feature = "cuda")]
    if let Device::Cuda(cuda) = dev {
        let _cached = cuda.enable_cuda_graph_htod_cache();
        return f();
    }
    let _ = dev;
    f()
}

const EAGER: usize = 0;
const CAPTURED: usize = 1;
const REPLAYED: usize = 2;
const FAILED: usize = 3;
/// Steps taken by each action in this process, and failed captures (`graph_counts`).
static COUNTS: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

fn count(action: Action) {
    let i = match action {
        Action::Eager => EAGER,
        Action::Capture => CAPTURED,
        Action::Replay => REPLAYED,
    };
    COUNTS[i].fetch_add(1, Ordering::Relaxed);
}

/// This process's steps by action so far: `eager`, `captured`, `replayed`, and failed
/// captures (`failed`), for the device checks.
pub fn graph_counts() -> [(&'static str, u64); 4] {
    let n = |i: usize| COUNTS[i].load(Ordering::Relaxed);
    [
        ("eager", n(EAGER)),
        ("captured", n(CAPTURED)),
        ("replayed", n(REPLAYED)),
        ("failed", n(FAILED)),
    ]
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Stream capture and launch through cudarc (the version candle uses).
    use crate::error::{Error, Result};
    use candle::cuda_backend::cudarc::driver::{result, sys, CudaGraph};
    use candle::{CudaDevice, Device};

    /// A captured graph. cudarc's is neither `Send` nor `Sync`: a graph is used only under its
    /// stream's lock, by one thread at a time.
    pub struct Graph(CudaGraph);
    // SAFETY: see above; every use is serialized by the lock of the stream that owns it.
    unsafe impl Send for Graph {}
    unsafe impl Sync for Graph {}

    fn failed(what: &str, e: impl std::fmt::Debug) -> Error {
        Error::Device(format!("CUDA graph {what}: {e:?}"))
    }

    /// Captures `step` on the calling thread's stream. Thread-local mode: a call this thread
    /// may not make during a capture (a synchronous allocation, a copy from the host) fails
    /// the capture instead of corrupting it. Graph allocations left at a replay are freed
    /// first (`AUTO_FREE_ON_LAUNCH`).
    pub fn capture(dev: &CudaDevice, step: impl FnOnce() -> Result<()>) -> Result<Graph> {
        let stream = dev.cuda_stream();
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        stream
            .begin_capture(mode)
            .map_err(|e| failed("capture start", e))?;
        let ran = step();
        let flags = sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH;
        let graph = stream.end_capture(flags);
        ran?;
        match graph.map_err(|e| failed("capture", e))? {
            Some(g) => Ok(Graph(g)),
            None => Err(failed("capture", "an empty graph")),
        }
    }

    /// Launches `graph` on the calling thread's stream (where the step's inputs were written).
    pub fn launch(dev: &Device, graph: &Graph) -> Result<()> {
        let Device::Cuda(cuda) = dev else {
            return Err(Error::Internal("a CUDA graph replayed off CUDA".into()));
        };
        let stream = cuda.cuda_stream();
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| failed("launch", e))?;
        // SAFETY: the graph's buffers (its owner's) outlive it; the stream is this thread's.
        unsafe { result::graph::launch(graph.0.cu_graph_exec(), stream.cu_stream()) }
            .map_err(|e| failed("launch", e))
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    //! Without CUDA nothing is ever captured.
    use crate::error::Result;
    use candle::Device;

    /// Never made.
    pub enum Graph {}

    pub fn launch(_: &Device, graph: &Graph) -> Result<()> {
        match *graph {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle::Tensor;

    fn key(rows: usize, rings: &Tensor) -> GraphKey {
        GraphKey {
            batch: 4,
            rows,
            tokens: 1,
            dtype: DType::F32,
            rings: rings.id(),
        }
    }

    #[test]
    fn a_shape_warms_up_then_is_captured_once_and_replayed() {
        let ring = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        let mut plan = GraphPlan::default();
        let k = key(4, &ring);
        let mut seen: Vec<Action> = (0..WARMUP_STEPS).map(|_| plan.decide(k)).collect();
        assert!(seen.iter().all(|a| *a == Action::Eager), "{seen:?}");
        assert_eq!(plan.decide(k), Action::Capture);
        // Until the capture is reported, the shape is captured again, never replayed.
        assert_eq!(plan.decide(k), Action::Capture);
        plan.captured(k, true);
        seen = (0..3).map(|_| plan.decide(k)).collect();
        assert_eq!(seen, vec![Action::Replay; 3]);
        // Another mask (rows) and new rings are other shapes.
        assert_eq!(plan.decide(key(3, &ring)), Action::Eager);
        let copy = ring.copy().unwrap();
        assert_eq!(plan.decide(key(4, &copy)), Action::Eager);
        assert_eq!(plan.decide(k), Action::Replay);
    }

    #[test]
    fn a_failed_capture_leaves_its_shape_eager_and_old_shapes_are_dropped() {
        let ring = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        let mut plan = GraphPlan::default();
        let k = key(2, &ring);
        while plan.decide(k) != Action::Capture {}
        plan.captured(k, false);
        assert!((0..5).all(|_| plan.decide(k) == Action::Eager));
        for rows in 10..10 + MAX_GRAPHS {
            plan.decide(key(rows, &ring));
        }
        assert_eq!(plan.keys().count(), MAX_GRAPHS);
        assert!(plan.keys().all(|x| x != k), "the oldest shape is dropped");
        // Forgotten, it warms up again.
        assert_eq!(plan.decide(k), Action::Eager);
    }

    #[test]
    fn the_capture_free_recorder_runs_the_step_at_capture_and_at_each_replay() {
        let ring = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        let k = key(1, &ring);
        let mut graphs: Graphs<std::cell::Cell<u32>> = Graphs::default();
        while graphs.decide(k) != Action::Capture {}
        let bump = |c: &std::cell::Cell<u32>| {
            c.set(c.get() * 10 + 1);
            Ok(())
        };
        let made = || Ok(std::cell::Cell::new(2));
        let fill = |c: &std::cell::Cell<u32>| {
            c.set(c.get() + 2);
            Ok(())
        };
        let b = graphs.capture(&Device::Cpu, k, made, bump).unwrap();
        assert_eq!(b.map(|c| c.get()), Some(21), "made, then run once");
        assert_eq!(graphs.decide(k), Action::Replay);
        let b = graphs.replay(&Device::Cpu, k, fill, bump).unwrap();
        assert_eq!(b.get(), 231);
        assert!(graphs.clone().entries.is_empty(), "a copy records its own");
    }
}
