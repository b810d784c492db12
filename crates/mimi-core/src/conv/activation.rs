//! The ELU SEANet applies before its convolutions, computed once per element with a
//! vectorisable exponential ([`crate::kernels::exp_nonpos`]), compiled for AVX-512 or
//! AVX2+FMA where the CPU has them (the same operations in the same order: the same bits).
//! It stays beside the convolutions (rather than among the kernels) because only they apply
//! it: on a copy of the input ([`copy_act`]) or on a fused block's hidden tile
//! ([`elu_in_place`]).

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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn copy_act_avx512(src: &[f32], dst: &mut [f32], alpha: f32) {
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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
unsafe fn elu_in_place_avx512(v: &mut [f32], alpha: f32) {
    elu_in_place_generic(v, alpha)
}

#[cfg(target_arch = "x86_64")]
fn avx2_fma() -> bool {
    crate::kernels::cpu::has(crate::kernels::cpu::Level::Avx2)
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    crate::kernels::cpu::has(crate::kernels::cpu::Level::Avx512)
}

/// `v = elu(v)` in place.
pub(super) fn elu_in_place(v: &mut [f32], alpha: f32) {
    #[cfg(target_arch = "x86_64")]
    {
        if avx512() {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { elu_in_place_avx512(v, alpha) };
        }
        if avx2_fma() {
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
        if avx512() {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { copy_act_avx512(src, dst, alpha) };
        }
        if avx2_fma() {
            // SAFETY: the CPU supports the features the function was compiled for.
            return unsafe { copy_act_avx2(src, dst, alpha) };
        }
    }
    copy_act_generic(src, dst, alpha)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every compiled variant this CPU runs gives the portable loop's bits (the same
    /// operations in the same order), on values around 0, large negatives and every tail
    /// length.
    #[test]
    fn variants_have_the_portable_bits() {
        let src: Vec<f32> = (0..1000)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) * [1e-3, 0.1, 1.0, 80.0][i % 4])
            .collect();
        for n in [0, 1, 7, 15, 16, 17, 33, 1000] {
            let mut want = vec![0f32; n];
            copy_act_generic(&src[..n], &mut want, 0.7);
            let mut got = vec![0f32; n];
            copy_act(&src[..n], &mut got, Some(0.7));
            let mut inplace = src[..n].to_vec();
            elu_in_place(&mut inplace, 0.7);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "copy, {n}");
            assert_eq!(bits(&inplace), bits(&want), "in place, {n}");
            #[cfg(target_arch = "x86_64")]
            {
                use crate::kernels::cpu::{detected, Level};
                let avx512 = detected() >= Level::Avx512;
                type Variants = (
                    unsafe fn(&[f32], &mut [f32], f32),
                    unsafe fn(&mut [f32], f32),
                );
                let variants: [(bool, Variants, &str); 2] = [
                    (
                        detected() >= Level::Avx2,
                        (copy_act_avx2, elu_in_place_avx2),
                        "avx2",
                    ),
                    (avx512, (copy_act_avx512, elu_in_place_avx512), "avx512"),
                ];
                for (_, (copy, in_place), name) in variants.into_iter().filter(|v| v.0) {
                    let mut inplace = src[..n].to_vec();
                    // SAFETY: the CPU supports the features the functions were compiled for.
                    unsafe { copy(&src[..n], &mut got, 0.7) };
                    unsafe { in_place(&mut inplace, 0.7) };
                    assert_eq!(bits(&got), bits(&want), "{name} copy, {n}");
                    assert_eq!(bits(&inplace), bits(&want), "{name} in place, {n}");
                }
            }
        }
    }
}
