//! Devices, dtypes and the cargo features compiled into this build.

use crate::error::{Error, Result};
use candle::{DType, Device, DeviceLocation};

/// The optional backends compiled into this build.
pub fn compiled_features() -> Vec<&'static str> {
    let mut f = Vec::new();
    if cfg!(feature = "cuda") {
        f.push("cuda");
    }
    if cfg!(feature = "metal") {
        f.push("metal");
    }
    if cfg!(feature = "mkl") {
        f.push("mkl");
    }
    if cfg!(feature = "accelerate") {
        f.push("accelerate");
    }
    f
}

fn not_compiled(kind: &str) -> Error {
    Error::Device(format!(
        "device {kind:?} is not available: this build of mimi_py was compiled without the \
         `{kind}` feature; rebuild with `pip install . --config-settings=build-args='--features {kind}'` \
         (or `maturin build --release --features {kind}`)"
    ))
}

fn ordinal(spec: &str, prefix: &str) -> Result<usize> {
    match spec.strip_prefix(prefix) {
        Some("") => Ok(0),
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| unknown(spec)),
        None => Err(unknown(spec)),
    }
}

fn unknown(spec: &str) -> Error {
    Error::Device(format!(
        "unknown device {spec:?}; expected \"cpu\", \"cuda\", \"cuda:N\", \"metal\" or \"metal:N\""
    ))
}

/// What to do when the CUDA libraries are missing.
#[cfg(feature = "cuda")]
const CUDA_HINT: &str = "install the NVIDIA driver (it provides libcuda.so.1) and the CUDA 13 \
     libraries cuBLAS and cuRAND: `pip install nvidia-cublas nvidia-curand` (mimi_py loads pip's \
     nvidia-* libraries at import) or a CUDA toolkit, with its lib directory on LD_LIBRARY_PATH";

/// The shared libraries candle needs to open a CUDA device (the driver, cuBLAS, cuRAND), with
/// the names cudarc tries. A CUDA wheel loads them at run time (cudarc's `dynamic-loading`, see
/// scripts/build_cuda_wheel.sh), and cudarc panics when one is missing, so they are looked for
/// first.
#[cfg(all(feature = "cuda", target_os = "linux"))]
fn missing_cuda_library() -> Option<String> {
    const LIBS: [(&str, &str); 4] = [
        ("cuda", "the NVIDIA driver"),
        ("cublasLt", "cuBLASLt"),
        ("cublas", "cuBLAS"),
        ("curand", "cuRAND"),
    ];
    LIBS.iter().find_map(|&(name, what)| {
        let tried = library_candidates(name);
        (!tried.iter().any(|c| loadable(c))).then(|| {
            format!(
                "{what} (lib{name}) could not be loaded (tried {})",
                tried.join(", ")
            )
        })
    })
}

/// `libNAME.so` and the versioned sonames cudarc tries (CUDA 13, 12, 11; cuRAND is `.so.10`;
/// the driver `.so.1`).
#[cfg(all(any(feature = "cuda", test), target_os = "linux"))]
fn library_candidates(name: &str) -> Vec<String> {
    std::iter::once(format!("lib{name}.so"))
        .chain(
            ["13", "12", "11", "10", "9", "1"]
                .iter()
                .map(|v| format!("lib{name}.so.{v}")),
        )
        .collect()
}

/// Whether the dynamic loader can load this library (it stays loaded: cudarc opens it next).
#[cfg(all(any(feature = "cuda", test), target_os = "linux"))]
fn loadable(soname: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(soname) else {
        return false;
    };
    // SAFETY: a valid NUL-terminated name; loading a library runs its initialisers, as cudarc's
    // own dlopen of the same library would.
    !unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) }.is_null()
}

/// The process's one candle device for `cuda:n`, opened on first use ([`open_cuda_new`]):
/// every model on that GPU shares it. candle tells devices apart by the object
/// (`same_device`), so a state copied between two models opened separately (`copy_state`)
/// was refused, or failed at the next step. Sharing costs nothing: the device's work goes to
/// the calling thread's own stream whichever model it computes, and its cuBLAS handle may be
/// used from several threads.
#[cfg(feature = "cuda")]
fn open_cuda(n: usize) -> Result<Device> {
    static OPEN: std::sync::Mutex<Vec<(usize, Device)>> = std::sync::Mutex::new(Vec::new());
    let mut open = crate::error::locked(&OPEN);
    if let Some((_, dev)) = open.iter().find(|(i, _)| *i == n) {
        return Ok(dev.clone());
    }
    let dev = open_cuda_new(n)?;
    open.push((n, dev.clone()));
    Ok(dev)
}

/// Opens `cuda:n`: a missing library or driver is a `DeviceError` that says what to install,
/// never a panic (cudarc's loader panics; caught here as a last resort).
#[cfg(feature = "cuda")]
fn open_cuda_new(n: usize) -> Result<Device> {
    #[cfg(target_os = "linux")]
    if let Some(missing) = missing_cuda_library() {
        return Err(Error::Device(format!(
            "could not open cuda:{n}: {missing}; {CUDA_HINT}"
        )));
    }
    match std::panic::catch_unwind(|| Device::new_cuda(n)) {
        Ok(Ok(dev)) => {
            // TF32 flips codes (a code is an argmin over nearby centroids): off unless asked.
            candle::cuda::set_gemm_reduced_precision_f32(super::settings::get().cuda_tf32);
            set_up_cuda(&dev)
                .map_err(|e| Error::Device(format!("could not set up cuda:{n}: {e}")))?;
            Ok(dev)
        }
        Ok(Err(e)) => Err(Error::Device(format!("could not open cuda:{n}: {e}"))),
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic in the CUDA loader".into());
            Err(Error::Device(format!(
                "could not open cuda:{n}: {why}; {CUDA_HINT}"
            )))
        }
    }
}

/// The switches of a freshly opened CUDA device, before any tensor exists on it:
///
/// * `MIMI_PY_CUDA_POOL_KEEP`: the release threshold of the device's default memory pool
///   (which cudarc's stream-ordered allocations draw from). CUDA's default, 0, hands every
///   freed block back to the driver at each synchronization (every call ends with one), so
///   the next call grows the pool again; the switch's default keeps it all.
/// * `MIMI_PY_CUDA_EVENTS=0`: no CUDA event per allocation for cross-stream ordering. Safe
///   here because every call computes on its calling thread's stream alone and waits for it
///   before it returns (the module's invariant), so no tensor is ever in use on two streams at
///   once; on by default until a device run has measured it (benches/gpu.py's variants).
#[cfg(feature = "cuda")]
fn set_up_cuda(dev: &Device) -> candle::Result<()> {
    use candle::cuda_backend::cudarc::driver::sys;
    let Device::Cuda(cuda) = dev else {
        return Ok(());
    };
    let s = super::settings::get();
    if !s.cuda_events || s.cuda_graphs {
        // SAFETY: see above: no tensor is used on a stream other than its allocating one
        // while work on that stream is pending. Graphs need it off: a captured step may not
        // wait on an event recorded before its capture began.
        unsafe { cuda.disable_event_tracking() };
    }
    let keep: u64 = match s.cuda_pool_keep_mb {
        None => u64::MAX,
        Some(mb) => mb.saturating_mul(1 << 20),
    };
    let stream = cuda.cuda_stream();
    let failed = |what: &str, e: sys::CUresult| candle::Error::Msg(format!("{what}: {e:?}"));
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut value = keep;
    // SAFETY: the device handle is the open context's; the attribute takes a u64 by pointer.
    unsafe {
        let r = sys::cuDeviceGetDefaultMemPool(&mut pool, stream.context().cu_device());
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed("the device's memory pool", r));
        }
        let r = sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut value as *mut u64).cast(),
        );
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(failed("the memory pool's release threshold", r));
        }
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_n: usize) -> Result<Device> {
    Err(not_compiled("cuda"))
}

/// Parses a device string and opens the device. Returns the device and its canonical name.
pub fn parse_device(spec: &str) -> Result<(Device, String)> {
    let s = spec.trim().to_ascii_lowercase();
    if s == "cpu" {
        return Ok((Device::Cpu, "cpu".into()));
    }
    if s.starts_with("cuda") {
        let n = ordinal(&s, "cuda")?;
        return Ok((open_cuda(n)?, format!("cuda:{n}")));
    }
    if s.starts_with("metal") {
        let n = ordinal(&s, "metal")?;
        if !cfg!(feature = "metal") {
            return Err(not_compiled("metal"));
        }
        let dev = Device::new_metal(n)
            .map_err(|e| Error::Device(format!("could not open metal:{n}: {e}")))?;
        return Ok((dev, format!("metal:{n}")));
    }
    Err(unknown(spec))
}

/// A device's canonical name, as [`parse_device`] gives it: "cpu", "cuda:0", "metal:0".
pub fn device_name(device: &Device) -> String {
    match device.location() {
        DeviceLocation::Cpu => "cpu".into(),
        DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
    }
}

/// A compute dtype's canonical name, as [`parse_dtype`] gives it.
pub fn dtype_name(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float32",
        DType::F16 => "float16",
        DType::BF16 => "bfloat16",
        other => other.as_str(),
    }
}

/// Parses a dtype name. Returns the dtype and its canonical name.
pub fn parse_dtype(spec: &str) -> Result<(DType, &'static str)> {
    let dtype = |d: DType| Ok((d, dtype_name(d)));
    match spec.trim().to_ascii_lowercase().as_str() {
        "float32" | "f32" => dtype(DType::F32),
        "float16" | "f16" | "half" => dtype(DType::F16),
        "bfloat16" | "bf16" => dtype(DType::BF16),
        _ => Err(Error::config(
            "dtype",
            format!("expected \"float32\", \"float16\" or \"bfloat16\", got {spec:?}"),
        )),
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn library_probe() {
        // glibc's libc.so.6 is always there; a made-up name never is.
        assert!(loadable("libc.so.6"));
        assert!(!library_candidates("mimi_py_no_such_library")
            .iter()
            .any(|c| loadable(c)));
        assert!(library_candidates("curand").contains(&"libcurand.so.10".to_string()));
    }

    #[test]
    fn cuda_without_the_feature_or_driver_is_a_device_error() {
        // CPU build: "compiled without"; CUDA build on a machine without a driver: the reason.
        if cfg!(feature = "cuda") && loadable("libcuda.so.1") {
            return;
        }
        match parse_device("cuda:0") {
            Err(Error::Device(msg)) => assert!(msg.contains("cuda"), "{msg}"),
            other => panic!("expected a device error, got {:?}", other.map(|d| d.1)),
        }
    }
}

/// `t` as `dtype`. candle launches its cast kernel even for a tensor of no elements, and CUDA
/// refuses a launch of no blocks (`CUDA_ERROR_INVALID_VALUE`, as a `ComputeError`): such a
/// tensor is made anew instead ([`zeros_on`]). Elsewhere the same as `Tensor::to_dtype`.
pub fn cast(t: &candle::Tensor, dtype: DType) -> candle::Result<candle::Tensor> {
    if t.dtype() != dtype && t.elem_count() == 0 {
        return zeros_on(t.shape(), dtype, t.device());
    }
    t.to_dtype(dtype)
}

/// Zeros of `shape` on `dev`. A tensor of no elements is made on the host and copied over,
/// the one way that launches no kernel on CUDA (see [`cast`]).
pub fn zeros_on(
    shape: impl Into<candle::Shape>,
    dtype: DType,
    dev: &Device,
) -> candle::Result<candle::Tensor> {
    let shape = shape.into();
    if shape.elem_count() == 0 && !dev.is_cpu() {
        return candle::Tensor::zeros(shape, dtype, &Device::Cpu)?.to_device(dev);
    }
    candle::Tensor::zeros(shape, dtype, dev)
}
