//! Helpers shared by the core's unit tests.

use candle::Tensor;

/// Random activations for tests.
pub fn test_input(b: usize, t: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..b * t * d)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// Largest absolute elementwise difference of two slices of one length, for tests. A NaN
/// difference (either side NaN, or infinities of one sign) counts as infinity: `f32::max`
/// and candle's `max` both drop NaN, so a plain fold passes an output that is all NaN.
pub fn max_abs_diff_slices(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y).abs();
            if d.is_nan() {
                f32::INFINITY
            } else {
                d
            }
        })
        .fold(0.0, f32::max)
}

/// Largest absolute elementwise difference of two tensors of one shape (read as f32), for
/// tests; NaN counts as infinity, as in [`max_abs_diff_slices`].
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "compared tensors differ in shape");
    let flat = |t: &Tensor| -> Vec<f32> {
        t.to_dtype(candle::DType::F32)
            .and_then(|t| t.flatten_all()?.to_vec1())
            .expect("a tensor readable as f32")
    };
    max_abs_diff_slices(&flat(a), &flat(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nan_or_infinite_difference_is_the_largest() {
        let want = [0.0f32, 1.0, -2.0, 3.0];
        assert_eq!(max_abs_diff_slices(&want, &want), 0.0);
        assert_eq!(max_abs_diff_slices(&[0.0, 1.5, -2.0, 3.0], &want), 0.5);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for i in 0..want.len() {
                let mut got = want;
                got[i] = bad;
                assert_eq!(
                    max_abs_diff_slices(&got, &want),
                    f32::INFINITY,
                    "{bad} at {i}"
                );
            }
        }
        let nan = [f32::NAN; 4];
        assert_eq!(max_abs_diff_slices(&nan, &nan), f32::INFINITY);
        let inf = [f32::INFINITY; 4];
        assert_eq!(max_abs_diff_slices(&inf, &inf), f32::INFINITY);
    }

    #[test]
    fn tensors_with_a_nan_anywhere_differ_by_infinity() {
        let dev = candle::Device::Cpu;
        let want = Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0]], &dev).unwrap();
        for i in 0..4 {
            let mut v = vec![1.0f32, 2.0, 3.0, 4.0];
            v[i] = f32::NAN;
            let got = Tensor::from_vec(v, (2, 2), &dev).unwrap();
            assert_eq!(max_abs_diff(&got, &want), f32::INFINITY, "NaN at {i}");
        }
        let half = want.to_dtype(candle::DType::F16).unwrap();
        assert_eq!(max_abs_diff(&half, &want), 0.0);
    }
}
