//! The README's Rust example, as written there, run on a Hugging Face layout checkpoint
//! (tests/data/codec: kyutai/mimi's file names and config.json, q/k half-split) and checked
//! against the codes the Python package gives (the PyTorch reference's, which
//! tests/codec/test_codec.py asserts `MimiCodec` reproduces exactly).

use mimi_core::candle::{DType, Tensor};
use mimi_core::HostArray;
use std::path::{Path, PathBuf};

/// What the example gives: the codes, the decoded audio, the stream's first codes.
type Outputs = (HostArray<u32>, HostArray<f32>, Option<HostArray<u32>>);

/// The lines between the markers are the README's ```rust block, verbatim.
fn readme_example(
    path: &Path,
    samples: Vec<f32>,
    chunk: HostArray<f32>,
) -> mimi_core::Result<Outputs> {
    // README begin
    use mimi_core::{Codec, EncodeStep, HostArray, OpenOptions};
    let codec = Codec::open(path, &OpenOptions::default())?; // kyutai/mimi's folder or file
    let n = samples.len(); // mono float32 audio at 24 kHz
    let pcm = HostArray::new(samples, vec![1, 1, n]); // (batch, channels, samples)
    let codes = codec.encode_host(pcm, None, None)?; // (batch, codebooks, frames) u32
    let audio = codec.decode_host(codes.clone(), None, None)?; // (batch, channels, samples)
    let mut stream = codec.encode_stream();
    let first = codec.encode_step_host(&mut stream, chunk, EncodeStep::default())?; // Some(codes) once a frame completes

    // README end
    Ok((codes, audio, first))
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
    let samples: Vec<f32> = pcm.flatten_all().unwrap().to_vec1().unwrap();
    let frame = 1920;
    let chunk = HostArray::new(samples[..2 * frame].to_vec(), vec![1, 1, 2 * frame]);
    let (codes, audio, first) = readme_example(&dir, samples, chunk).unwrap();
    let expected = reference("codes");
    assert_eq!(codes.shape, expected.dims());
    assert_eq!(codes.data, codes_of(&expected));
    // The trap this closes: the interleaved rotary on half-split q/k gives other codes.
    assert_ne!(
        codes.data,
        codes_of(&reference("codes_interleaved_rope_on_hf_layout"))
    );
    // The decoded audio: the reference's within the tolerance its metadata states.
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(data("mimi_small.json")).unwrap()).unwrap();
    let tol = |k: &str| meta["tolerance"]["audio"][k].as_f64().unwrap() as f32;
    let (atol, rtol) = (tol("atol"), tol("rtol"));
    let want: Vec<f32> = reference("audio").flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(audio.shape, vec![1, 1, want.len()]);
    for (i, (a, b)) in audio.data.iter().zip(&want).enumerate() {
        assert!(
            (a - b).abs() <= atol + rtol * b.abs(),
            "sample {i}: {a} vs {b}"
        );
    }
    // The stream's first whole frames are the offline codes' first frames.
    let first = first.expect("two frames of audio complete two frames");
    let n = first.shape[2];
    assert_eq!(n, 2);
    assert_eq!(first.data, codes_of(&expected.narrow(2, 0, n).unwrap()));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn a_checkpoint_file_opens_with_a_given_config() {
    use mimi_core::{Codec, CodecConfig};
    let file = data("mimi_small.safetensors");
    let cfg: CodecConfig = {
        let dir = hf_folder("given");
        let opened = mimi_core::codec::open::resolve(&dir, &Default::default()).unwrap();
        std::fs::remove_dir_all(dir).unwrap();
        opened.config
    };
    // The front door reads the same file (no config.json beside it: the config is given).
    let options = mimi_core::OpenOptions {
        config: Some(cfg),
        ..Default::default()
    };
    let codec = Codec::open(&file, &options).unwrap();
    let pcm = reference("waveform");
    let pcm = mimi_core::HostArray::new(
        pcm.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        pcm.dims().to_vec(),
    );
    let codes = codec.encode_host(pcm, None, None).unwrap();
    assert_eq!(codes.data, codes_of(&reference("codes")));
}
