//! The checkpoint door: arbitrary bytes as a safetensors file into `Codec::open` (its
//! header, offsets, dtypes, shapes and names, in both layouts: Hugging Face's half-split q/k
//! and Kyutai's interleaved one). The first byte picks how it is opened (engine, precision);
//! the rest is the file. A file is refused with a typed error or opens into a codec of the
//! config it was opened with, which then decodes a frame without an untyped error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mimi_core::codec::EngineKind;
use mimi_core::runtime::precision::Precision;
use mimi_core::{Codec, HostArray, OpenOptions};
use mimi_fuzz::{assert_typed, micro_checkpoint_config};
use std::path::PathBuf;
use std::sync::OnceLock;

/// One file per process, rewritten each execution (in memory where /dev/shm exists).
fn scratch() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let dir = if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("mimi-fuzz-{}.safetensors", std::process::id()))
    })
}

fn options(selector: u8) -> OpenOptions {
    let (engine, precision) = match selector % 4 {
        0 => (EngineKind::Native, Precision::Highest),
        1 => (EngineKind::Native, Precision::High),
        2 => (EngineKind::Candle, Precision::Highest),
        _ => (EngineKind::Native, Precision::Medium),
    };
    OpenOptions {
        engine: Some(engine),
        precision,
        config: Some(micro_checkpoint_config()),
        ..Default::default()
    }
}

/// A codec that opened: its config is the one asked for, and a frame of codes decodes
/// (weights may hold anything, so the values are not judged) or is refused with a type.
fn check_opened(codec: &Codec) {
    let cfg = micro_checkpoint_config();
    assert_eq!(codec.config(), &cfg, "opened with another config");
    let k = cfg.quantizer_n_q;
    let codes = HostArray::new(vec![1u32; k], vec![1, k, 1]);
    match codec.decode_host(codes, None, None) {
        Ok(audio) => assert_eq!(audio.shape, [1, 1, cfg.frame_size()]),
        Err(e) => assert_typed(&e, "decoding with an opened checkpoint"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, file)) = data.split_first() else {
        return;
    };
    let path = scratch();
    std::fs::write(path, file).expect("the scratch file is writable");
    match Codec::open(path, &options(selector)) {
        Ok(codec) => check_opened(&codec),
        Err(e) => assert_typed(&e, "Codec::open"),
    }
});
