//! The ELU SEANet applies before its convolutions, computed once per element with a
//! vectorisable exponential ([`crate::kernels::exp_nonpos`]), compiled for AVX2+FMA where
//! the CPU has it. It stays beside the convolutions (rather than among the kernels) because
//! only they apply it: on a copy of the input ([`copy_act`]) or on a fused block's hidden
//! tile ([`elu_in_place`]).

/// `e^x - 1` for `x <= 0`, vectorisable.
#[inline(always)]
fn expm1_nonpos(x: f32) -> f32 {
    crate::kernels::exp_nonpos(x) - 1.0
}

#[inline(always)]
fn copy_act_generic(src: &[f32], dst: &mut [f32], alpha: f32) {
    for (d, &x) in dst.iter_mut().zip(src) {
        let e = alpha * expm1_nonpos(x);
        *d = if x > 0.0 { x } else { e };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn copy_act_avx2(src: &[f32], dst: &mut [f32], alpha: f32) {
    copy_act_generic(src, dst, alpha)
}

#[inline(always)]
fn elu_in_place_generic(v: &mut [f32], alpha: f32) {
    for x in v.iter_mut() {
        let e = alpha * expm1_nonpos(*x);
        *x = if *x > 0.0 { *x } else { e };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn elu_in_place_avx2(v: &mut [f32], alpha: f32) {
    elu_in_place_generic(v, alpha)
}

/// `v = elu(v)` in place.
pub(super) fn elu_in_place(v: &mut [f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { elu_in_place_avx2(v, alpha) };
        }
    }
    elu_in_place_generic(v, alpha)
}

/// `dst = elu(src)` (or a plain copy without activation).
pub(super) fn copy_act(src: &[f32], dst: &mut [f32], act: Option<f32>) {
    let Some(alpha) = act else {
        dst.copy_from_slice(src);
        return;
    };
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { copy_act_avx2(src, dst, alpha) };
        }
    }
    copy_act_generic(src, dst, alpha)
}
