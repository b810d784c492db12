//! The calls into cuDNN: a handle per thread (on candle's per-thread stream), each plan's
//! descriptors, algorithm and workspace, and the forward convolution as a candle op.

use super::{math_for, ConvShape, Math, PlanCache, PlanKey, PLANS_PER_THREAD};
use crate::error::{Error, Result};
use candle::cuda_backend::cudarc::cudnn::{
    sys, ConvDescriptor, ConvForward, Cudnn, CudnnDataType, FilterDescriptor, TensorDescriptor,
};
use candle::cuda_backend::cudarc::driver::{CudaSlice, CudaStream};
use candle::cuda_backend::{CudaDType, CudaStorage};
use candle::{CpuStorage, CustomOp2, DType, Layout, Shape, Tensor};
use std::cell::RefCell;
use std::sync::{Arc, Mutex, OnceLock};

/// Why libcudnn could not be used, once it was found out (then every call takes candle's path).
static UNAVAILABLE: OnceLock<String> = OnceLock::new();
/// The last call cuDNN refused (its shape and error), which then took candle's path.
static REFUSED: Mutex<Option<String>> = Mutex::new(None);

pub fn unavailable() -> Option<String> {
    let refused = REFUSED.lock().ok().and_then(|r| r.clone());
    UNAVAILABLE.get().cloned().or(refused)
}

/// One planned convolution: its descriptors (the convolution's computed in float32 for every
/// data type, as cuDNN's half and bfloat16 configurations want), algorithm and workspace.
struct Plan<T: CudnnDataType> {
    conv: ConvDescriptor<f32>,
    x: TensorDescriptor<T>,
    w: FilterDescriptor<T>,
    y: TensorDescriptor<T>,
    algo: sys::cudnnConvolutionFwdAlgo_t,
    workspace: Option<CudaSlice<u8>>,
}

/// A thread's handle and plans, one cache per dtype.
struct ThreadPlans {
    stream: Arc<CudaStream>,
    handle: Arc<Cudnn>,
    f32: PlanCache<Plan<f32>>,
    bf16: PlanCache<Plan<half::bf16>>,
    f16: PlanCache<Plan<half::f16>>,
}

thread_local! {
    static PLANS: RefCell<Option<ThreadPlans>> = const { RefCell::new(None) };
}

fn failed(what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("cuDNN {what}: {e:?}"))
}

/// The cuDNN math type of [`Math`].
fn math_type(m: Math) -> sys::cudnnMathType_t {
    match m {
        Math::Fma => sys::cudnnMathType_t::CUDNN_FMA_MATH,
        Math::TensorOp => sys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
        Math::Tf32 => sys::cudnnMathType_t::CUDNN_DEFAULT_MATH,
    }
}

/// `x` convolved with `w` through cuDNN, or `None` where libcudnn is missing (candle's path).
pub fn conv1d(x: &Tensor, w: &Tensor, stride: usize, dilation: usize) -> Result<Option<Tensor>> {
    if UNAVAILABLE.get().is_some() {
        return Ok(None);
    }
    let shape = ConvShape::of(x.dims(), w.dims(), stride, dilation)?;
    let op = CudnnConv {
        key: PlanKey {
            layer: w.id(),
            shape,
            dtype: x.dtype(),
        },
    };
    let (x, w) = (x.contiguous()?, w.contiguous()?);
    match x.apply_op2_no_bwd(&w, &op) {
        Ok(y) => Ok(Some(y)),
        Err(e) => {
            // A shape or dtype cuDNN refuses takes candle's path; the device check reads why.
            if let Ok(mut r) = REFUSED.lock() {
                *r = Some(format!("cuDNN refused {:?}: {e}", op.key.shape));
            }
            Ok(None)
        }
    }
}

/// The op candle runs: cuDNN's forward convolution of a planned shape.
struct CudnnConv {
    key: PlanKey,
}

impl CustomOp2 for CudnnConv {
    fn name(&self) -> &'static str {
        "mimi-cudnn-conv1d"
    }

    fn cpu_fwd(
        &self,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle::Result<(CpuStorage, Shape)> {
        candle::bail!("cuDNN convolutions run on CUDA only")
    }

    fn cuda_fwd(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> candle::Result<(CudaStorage, Shape)> {
        let s = self.key.shape;
        let out = Shape::from((s.batch, s.cout, s.out_len()));
        let y = match self.key.dtype {
            DType::F32 => self.run::<f32>(x, xl, w, wl),
            DType::BF16 => self.run::<half::bf16>(x, xl, w, wl),
            DType::F16 => self.run::<half::f16>(x, xl, w, wl),
            other => Err(failed("convolution", format!("dtype {other:?}"))),
        };
        y.map(|y| (y, out))
            .map_err(|e| candle::Error::Msg(e.to_string()))
    }
}

/// The per-dtype plan caches of a thread.
trait Cached: CudnnDataType + CudaDType + candle::cuda_backend::cudarc::driver::DeviceRepr {
    fn cache(p: &mut ThreadPlans) -> &mut PlanCache<Plan<Self>>;
    /// alpha = 1, beta = 0 in the type cuDNN scales this data with.
    fn scaling() -> (Self, Self);
}

impl Cached for f32 {
    fn cache(p: &mut ThreadPlans) -> &mut PlanCache<Plan<Self>> {
        &mut p.f32
    }
    fn scaling() -> (Self, Self) {
        (1.0, 0.0)
    }
}

impl Cached for half::bf16 {
    fn cache(p: &mut ThreadPlans) -> &mut PlanCache<Plan<Self>> {
        &mut p.bf16
    }
    fn scaling() -> (Self, Self) {
        (half::bf16::ONE, half::bf16::ZERO)
    }
}

impl Cached for half::f16 {
    fn cache(p: &mut ThreadPlans) -> &mut PlanCache<Plan<Self>> {
        &mut p.f16
    }
    fn scaling() -> (Self, Self) {
        (half::f16::ONE, half::f16::ZERO)
    }
}

impl CudnnConv {
    /// Plans (once) and launches the convolution on this thread's stream.
    fn run<T: Cached>(
        &self,
        x: &CudaStorage,
        xl: &Layout,
        w: &CudaStorage,
        wl: &Layout,
    ) -> Result<CudaStorage> {
        let dev = x.device.clone();
        let xs = contiguous::<T>(x, xl)?;
        let ws = contiguous::<T>(w, wl)?;
        let s = self.key.shape;
        // SAFETY: every element is written by the convolution (beta = 0).
        let mut y = unsafe { dev.alloc::<T>(s.batch * s.cout * s.out_len()) }?;
        with_plans(&dev, |plans| {
            let tf32 = crate::runtime::settings::get().cuda_tf32;
            let (handle, stream) = (plans.handle.clone(), plans.stream.clone());
            let make = || plan::<T>((&handle, &stream), s, math_for(self.key.dtype, tf32));
            let Plan {
                conv,
                x,
                w,
                y: yd,
                algo,
                workspace,
            } = T::cache(plans).get_or_plan(self.key, make)?;
            let fwd = ConvForward {
                conv: &*conv,
                x: &*x,
                w: &*w,
                y: &*yd,
            };
            // SAFETY: the descriptors were made for these shapes and this dtype; the slices
            // hold exactly their elements.
            unsafe { fwd.launch(*algo, workspace.as_mut(), T::scaling(), &xs, &ws, &mut y) }
                .map_err(|e| failed("forward convolution", e))
        })?;
        Ok(CudaStorage::wrap_cuda_slice(y, dev))
    }
}

/// The contiguous view of a storage as its layout says (the op's inputs are contiguous).
fn contiguous<'a, T: Cached>(
    s: &'a CudaStorage,
    l: &Layout,
) -> Result<candle::cuda_backend::cudarc::driver::CudaView<'a, T>> {
    let Some((a, b)) = l.contiguous_offsets() else {
        return Err(failed("convolution", "a non-contiguous input"));
    };
    Ok(s.as_cuda_slice::<T>()?.slice(a..b))
}

/// Runs `f` with this thread's handle and plans, made at its first use (on candle's stream
/// for this thread). A missing libcudnn is found out here, once for the process.
fn with_plans<R>(
    dev: &candle::CudaDevice,
    f: impl FnOnce(&mut ThreadPlans) -> Result<R>,
) -> Result<R> {
    PLANS.with(|cell| {
        let mut slot = cell.borrow_mut();
        let stream = dev.cuda_stream();
        let stale = slot
            .as_ref()
            .is_some_and(|p| !Arc::ptr_eq(&p.stream, &stream));
        if slot.is_none() || stale {
            *slot = Some(new_thread_plans(stream)?);
        }
        f(slot.as_mut().expect("made above"))
    })
}

/// A handle on `stream`; loading libcudnn panics in cudarc when it is missing, which is
/// caught and remembered.
fn new_thread_plans(stream: Arc<CudaStream>) -> Result<ThreadPlans> {
    let made =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| Cudnn::new(stream.clone())));
    let handle = match made {
        Ok(Ok(h)) => h,
        Ok(Err(e)) => return Err(failed("handle", e)),
        Err(_) => {
            let why = "libcudnn (cuDNN 9) did not load: install the nvidia-cudnn-cu13 wheel or \
                       a system cuDNN 9; convolutions take candle's path";
            let _ = UNAVAILABLE.set(why.into());
            return Err(Error::Device(why.into()));
        }
    };
    Ok(ThreadPlans {
        stream,
        handle,
        f32: PlanCache::new(PLANS_PER_THREAD),
        bf16: PlanCache::new(PLANS_PER_THREAD),
        f16: PlanCache::new(PLANS_PER_THREAD),
    })
}

/// A shape's descriptors, its math type set, the heuristic's algorithm and its workspace.
fn plan<T: Cached>(
    (handle, stream): (&Arc<Cudnn>, &Arc<CudaStream>),
    s: ConvShape,
    math: Math,
) -> Result<Plan<T>> {
    let nchw = sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW;
    let (pad, stride, dilation) = s.conv_params();
    let mode = sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION;
    let mut conv = handle
        .create_conv2d::<f32>(pad, stride, dilation, mode)
        .map_err(|e| failed("convolution descriptor", e))?;
    conv.set_math_type(math_type(math))
        .map_err(|e| failed("math type", e))?;
    let x = handle.create_4d_tensor::<T>(nchw, s.input_dims());
    let w = handle.create_4d_filter::<T>(nchw, s.filter_dims());
    let y = handle.create_4d_tensor::<T>(nchw, s.output_dims());
    let (x, w, y) = match (x, w, y) {
        (Ok(x), Ok(w), Ok(y)) => (x, w, y),
        (x, w, y) => return Err(failed("descriptors", (x.err(), w.err(), y.err()))),
    };
    let fwd = ConvForward {
        conv: &conv,
        x: &x,
        w: &w,
        y: &y,
    };
    let algo = fwd.pick_algorithm().map_err(|e| failed("algorithm", e))?;
    let bytes = fwd
        .get_workspace_size(algo)
        .map_err(|e| failed("workspace size", e))?;
    let workspace = match bytes {
        0 => None,
        n => Some(
            stream
                .alloc_zeros::<u8>(n)
                .map_err(|e| failed("workspace", e))?,
        ),
    };
    Ok(Plan {
        conv,
        x,
        w,
        y,
        algo,
        workspace,
    })
}
