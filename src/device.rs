//! Devices, dtypes and the cargo features compiled into this build.

use crate::errors::{Error, Result};
use candle::{DType, Device};

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

/// Parses a device string and opens the device. Returns the device and its canonical name.
pub fn parse_device(spec: &str) -> Result<(Device, String)> {
    let s = spec.trim().to_ascii_lowercase();
    if s == "cpu" {
        return Ok((Device::Cpu, "cpu".into()));
    }
    if s.starts_with("cuda") {
        let n = ordinal(&s, "cuda")?;
        if !cfg!(feature = "cuda") {
            return Err(not_compiled("cuda"));
        }
        let dev = Device::new_cuda(n)
            .map_err(|e| Error::Device(format!("could not open cuda:{n}: {e}")))?;
        return Ok((dev, format!("cuda:{n}")));
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

/// Parses a dtype name. Returns the dtype and its canonical name.
pub fn parse_dtype(spec: &str) -> Result<(DType, &'static str)> {
    match spec.trim().to_ascii_lowercase().as_str() {
        "float32" | "f32" => Ok((DType::F32, "float32")),
        "float16" | "f16" | "half" => Ok((DType::F16, "float16")),
        "bfloat16" | "bf16" => Ok((DType::BF16, "bfloat16")),
        _ => Err(Error::config(
            "dtype",
            format!("expected \"float32\", \"float16\" or \"bfloat16\", got {spec:?}"),
        )),
    }
}
