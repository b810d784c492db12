//! The README's Rust example, as written there, run on a Hugging Face layout checkpoint
//! (tests/data/codec: kyutai/mimi's file names and config.json, q/k half-split) and checked
//! against the codes the Python package gives (the PyTorch reference's, which
//! tests/test_codec.py asserts `MimiCodec` reproduces exactly).

use mimi_core::candle::{DType, Device, Tensor};
use std::path::{Path, PathBuf};

/// The lines between the markers are the README's ```rust block, verbatim.
fn readme_example(path: &Path, pcm: &Tensor, chunk: &Tensor) -> mimi_core::Result<Vec<Tensor>> {
    // README begin
    use mimi_core::{Codec, OpenOptions};
    let codec = Codec::open(path, &OpenOptions::default())?; // kyutai/mimi's folder or file
    let codes = codec.encode(pcm, None)?; // (batch, codebooks, frames) u32
    let mut stream = codec.encode_stream();
    let frames = codec.encode_step(&mut stream, chunk)?; // Some(codes) once a frame completes

    // README end
    Ok([Some(codes), frames].into_iter().flatten().collect())
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/codec")
        .join(name)
}

/// A kyutai/mimi-like folder of its own for test `name`: `model.safetensors` and `config.json`.
fn hf_folder(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mimi-core-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(
        data("mimi_small.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    std::fs::copy(data("mimi_small_hf_config.json"), dir.join("config.json")).unwrap();
    dir
}

fn reference(name: &str) -> Tensor {
    let mut arrays = Tensor::read_npz_by_name(data("mimi_small_io.npz"), &[name]).unwrap();
    arrays.remove(0)
}

fn codes_of(t: &Tensor) -> Vec<u32> {
    t.to_dtype(DType::U32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn the_readme_shows_this_example() {
    let readme = include_str!("../../../README.md");
    let block = readme
        .split("```rust\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("the README has a ```rust block");
    let this = include_str!("readme.rs");
    let example = this
        .split("// README begin\n")
        .nth(1)
        .and_then(|rest| rest.split("    // README end").next())
        .unwrap();
    let trim = |s: &str| s.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    assert_eq!(trim(block).trim(), trim(example).trim());
}

#[test]
fn the_readme_example_opens_a_hugging_face_checkpoint_with_the_python_results() {
    let dir = hf_folder("readme");
    let pcm = reference("waveform");
    let frame = 1920;
    let chunk = pcm.narrow(2, 0, 2 * frame).unwrap();
    let out = readme_example(&dir, &pcm, &chunk).unwrap();
    let expected = reference("codes");
    assert_eq!(out[0].dims(), expected.dims());
    assert_eq!(codes_of(&out[0]), codes_of(&expected));
    // The trap this closes: the interleaved rotary on half-split q/k gives other codes.
    assert_ne!(
        codes_of(&out[0]),
        codes_of(&reference("codes_interleaved_rope_on_hf_layout"))
    );
    // The stream's first whole frames are the offline codes' first frames.
    let streamed = &out[1];
    let n = streamed.dim(2).unwrap();
    assert!(n >= 1);
    assert_eq!(
        codes_of(streamed),
        codes_of(&expected.narrow(2, 0, n).unwrap())
    );
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn codec_new_refuses_a_checkpoint_file_and_names_codec_open() {
    use mimi_core::{Codec, CodecConfig, TensorSource};
    let file = data("mimi_small.safetensors");
    let cfg: CodecConfig = {
        let dir = hf_folder("refuse");
        let opened = mimi_core::codec::open::resolve(&dir, &Default::default()).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
        opened.config
    };
    let source = TensorSource::file(&file).unwrap();
    let err = Codec::new(&cfg, source, &Device::Cpu, DType::F32)
        .err()
        .expect("a checkpoint file is refused");
    let msg = err.to_string();
    assert!(matches!(err, mimi_core::Error::Weights(_)), "{msg}");
    assert!(msg.contains("Codec::open"), "{msg}");
    assert!(msg.contains("half-split"), "{msg}");
    // The front door reads the same file (no config.json beside it: the config is given).
    let options = mimi_core::OpenOptions {
        config: Some(cfg),
        ..Default::default()
    };
    let codec = Codec::open(&file, &options).unwrap();
    let codes = codec.encode(&reference("waveform"), None).unwrap();
    assert_eq!(codes_of(&codes), codes_of(&reference("codes")));
}
