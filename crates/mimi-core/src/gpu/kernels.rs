//! Fused CUDA kernels, compiled at run time by NVRTC, for the steps where a device census
//! shows launches dominating: the quantizer's nearest-codeword search (distances, argmin and
//! the residual's update in one launch per codebook instead of five) and a streaming
//! convolution's history (the `[history ++ input]` window and the new history, written into
//! fixed buffers, so a captured step keeps its addresses).
//!
//! They are written and compiled, not yet called: no device run has measured them (the census
//! of `scripts/gpu_check.sh` names the steps worth it). NVRTC compiles without a GPU, so the
//! `cuda` build's tests compile every source here (`scripts/check_cuda.sh`), and a compile
//! error fails them.

/// One CUDA source: its module name, its text and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    /// The module's name (candle's custom-module key).
    pub module: &'static str,
    /// The CUDA C++ text.
    pub text: &'static str,
    /// The `extern "C" __global__` functions it defines.
    pub kernels: &'static [&'static str],
}

/// The nearest codeword of each token, one block per token: `dist = |c|^2 - 2 x.c` over the
/// `bins` codewords (the token's own `|x|^2` cannot change the argmin), the first of the
/// smallest on ties (as candle's argmin), then `residual -= codeword` in place.
pub const QUANTIZE: Source = Source {
    module: "mimi_quantize",
    kernels: &["nearest_codeword_f32"],
    text: r#"
extern "C" __global__ void nearest_codeword_f32(
    float *residual, const float *codebook, const float *norms, unsigned int *codes,
    int bins, int dim, int code_stride)
{
    extern __shared__ unsigned char shared[];
    float *best_d = (float *)shared;
    int *best_i = (int *)(best_d + blockDim.x);
    const int token = blockIdx.x;
    float *x = residual + (size_t)token * dim;
    float d_min = __int_as_float(0x7f800000);
    int i_min = bins;
    for (int c = threadIdx.x; c < bins; c += blockDim.x) {
        const float *w = codebook + (size_t)c * dim;
        float dot = 0.0f;
        for (int j = 0; j < dim; ++j) dot = fmaf(x[j], w[j], dot);
        float d = fmaf(-2.0f, dot, norms[c]);
        if (d < d_min || (d == d_min && c < i_min)) { d_min = d; i_min = c; }
    }
    best_d[threadIdx.x] = d_min;
    best_i[threadIdx.x] = i_min;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            float d = best_d[threadIdx.x + s];
            int i = best_i[threadIdx.x + s];
            if (d < best_d[threadIdx.x] || (d == best_d[threadIdx.x] && i < best_i[threadIdx.x])) {
                best_d[threadIdx.x] = d;
                best_i[threadIdx.x] = i;
            }
        }
        __syncthreads();
    }
    const int code = best_i[0] < bins ? best_i[0] : 0;
    if (threadIdx.x == 0) codes[(size_t)token * code_stride] = (unsigned int)code;
    const float *w = codebook + (size_t)code * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) x[j] -= w[j];
}
"#,
};

/// A streaming convolution's window and history for a batch, into fixed buffers: `window =
/// [history ++ input]` per row and channel, then `history = window[.., len - h ..]`; two
/// launches, neither reading what it writes.
pub const HISTORY: Source = Source {
    module: "mimi_history",
    kernels: &["window_f32", "window_bf16", "history_f32", "history_bf16"],
    text: r#"
#include <cuda_bf16.h>
#define WINDOW(NAME, T)                                                                     \
extern "C" __global__ void NAME(const T *hist, const T *x, T *window, int rows, int h,     \
                                int n)                                                      \
{                                                                                           \
    const size_t len = (size_t)h + n;                                                       \
    const size_t total = (size_t)rows * len;                                                \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;               \
         i += (size_t)gridDim.x * blockDim.x) {                                             \
        const size_t r = i / len, t = i % len;                                              \
        window[i] = t < (size_t)h ? hist[r * h + t] : x[r * n + (t - h)];                   \
    }                                                                                       \
}
#define HISTORY(NAME, T)                                                                    \
extern "C" __global__ void NAME(const T *window, T *hist, int rows, int h, int len)        \
{                                                                                           \
    const size_t total = (size_t)rows * h;                                                  \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;               \
         i += (size_t)gridDim.x * blockDim.x) {                                             \
        const size_t r = i / h, t = i % h;                                                  \
        hist[i] = window[r * len + (len - h) + t];                                          \
    }                                                                                       \
}
WINDOW(window_f32, float)
WINDOW(window_bf16, __nv_bfloat16)
HISTORY(history_f32, float)
HISTORY(history_bf16, __nv_bfloat16)
"#,
};

/// Every source, for the compile check.
pub const SOURCES: &[Source] = &[QUANTIZE, HISTORY];

/// Compiles `src` to PTX with NVRTC (no GPU needed; libnvrtc must load).
#[cfg(feature = "cuda")]
pub fn compile(src: &Source) -> crate::error::Result<String> {
    use candle::cuda_backend::cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
    let include = std::env::var("CUDA_ROOT")
        .ok()
        .map(|r| format!("{r}/include"));
    let opts = CompileOptions {
        include_paths: include.into_iter().collect(),
        ..Default::default()
    };
    let ptx = std::panic::catch_unwind(|| compile_ptx_with_opts(src.text, opts))
        .map_err(|_| crate::error::Error::Device("libnvrtc did not load".into()))?
        .map_err(|e| crate::error::Error::Device(format!("NVRTC, {}: {e:?}", src.module)))?;
    Ok(ptx.to_src())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_once_as_extern_c() {
        for src in SOURCES {
            for k in src.kernels {
                let plain = format!("extern \"C\" __global__ void {k}(");
                let made = src.text.matches(&format!("({k}, ")).count();
                assert_eq!(
                    src.text.matches(&plain).count() + made,
                    1,
                    "{}: {k} is not defined exactly once",
                    src.module
                );
            }
        }
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn every_source_compiles_with_nvrtc() {
        for src in SOURCES {
            let ptx = compile(src).unwrap_or_else(|e| panic!("{e}"));
            for k in src.kernels {
                assert!(
                    ptx.contains(&format!(".entry {k}(")),
                    "{}: no entry {k}",
                    src.module
                );
            }
        }
    }
}
