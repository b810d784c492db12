//! A native offline call on host arrays makes no candle tensor: `encode_host`,
//! `encode_latents_host`, `decode_host` and `decode_latents_host` (with `lengths=` or not) pass the native engine's
//! frames from the input's values to the output's (counted by `runtime::profile::tensors_made`
//! at every place the codec's edges make one). The candle engine's calls do make them, which
//! shows that the count counts. One test in its own binary: nothing else runs beside it.

use mimi_core::codec::EngineKind;
use mimi_core::runtime::profile::tensors_made;
use mimi_core::{Codec, CodecConfig, HostArray, OpenOptions};

fn codec(engine: EngineKind) -> Codec {
    let options = OpenOptions {
        config: Some(CodecConfig::tiny()),
        engine: Some(engine),
        ..Default::default()
    };
    Codec::seeded(0, &options).unwrap()
}

#[test]
fn native_offline_calls_make_no_tensor() {
    let (native, candle) = (codec(EngineKind::Native), codec(EngineKind::Candle));
    let n = 5 * native.config().frame_size() + 700;
    let values = (0..2 * n).map(|i| (i as f32 * 0.013).sin() * 0.3).collect();
    let pcm = HostArray::new(values, vec![2, 1, n]);

    let before = tensors_made();
    let codes = native.encode_host(pcm.clone(), None, None).unwrap();
    let latents = native.encode_latents_host(pcm.clone(), None, None).unwrap();
    let audio = native.decode_host(codes.clone(), None, None).unwrap();
    let dequantized = native.decode_latents_host(codes.clone(), None).unwrap();
    assert_eq!(
        tensors_made(),
        before,
        "a native offline call made a tensor"
    );
    assert_eq!(codes.shape, vec![2, native.config().quantizer_n_q, 6]);
    assert_eq!(latents.shape[2], 6);
    assert_eq!(audio.shape, vec![2, 1, 6 * native.config().frame_size()]);
    assert_eq!(dequantized.shape, latents.shape);
    assert!(audio
        .data
        .iter()
        .chain(&latents.data)
        .all(|v| v.is_finite()));

    candle.encode_host(pcm, None, None).unwrap();
    assert!(
        tensors_made() > before,
        "the candle engine's call was not counted"
    );
}
