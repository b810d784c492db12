//! Streams, differentially: a random sequence of steps (all rows or an `active=` mask, one to
//! three tokens or frames), row resets, whole resets, copies and forks, on two small
//! transformers whose states copy into each other and on a small codec's encode/decode
//! streams. Every row of a batched stream is checked against the same row run alone, a
//! stream of one row that took the same steps: its output must be the same bits (a wrong
//! answer fails, not only a crash), and a masked step's resting rows give zeros.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mimi_core::codec::Rows;
use mimi_core::transformer::{State, Transformer, Workspace};
use mimi_core::{Codec, DecodeStream, EncodeStep, EncodeStream, HostArray};
use mimi_fuzz::{mask, pico_codec, signal, small_transformers};

#[derive(Arbitrary, Debug)]
enum Op {
    /// A step of stream `which` (0 or 1): every row, or the rows of `mask`.
    Step {
        which: bool,
        mask: Option<u8>,
        tokens: u8,
        seed: u16,
    },
    ResetRows {
        which: bool,
        rows: u8,
    },
    Reset {
        which: bool,
    },
    /// Stream `!from` continues as `from` would (`copy_state`, across the two models).
    Copy {
        from: bool,
    },
    Encode {
        mask: Option<u8>,
        frames: u8,
        seed: u16,
    },
    Decode {
        mask: Option<u8>,
        frames: u8,
        seed: u16,
    },
    CodecResetRows {
        rows: u8,
    },
    /// The codec's pair forks: the spare pair becomes a copy of the main one.
    Fork,
    /// The main pair and the spare swap (the fork continues; the main pair rests).
    Swap,
}

/// Operations a sequence runs at most: short sequences, many of them (each execution is one).
const MAX_OPS: usize = 6;

#[derive(Arbitrary, Debug)]
struct Sequence {
    batch: u8,
    ops: Vec<Op>,
}

/// One transformer stream of `batch` rows and each row alone.
#[derive(Default)]
struct TrStream {
    state: State,
    ws: Workspace,
    alone: Vec<(State, Workspace)>,
}

fn rows_of(bits: Option<u8>, batch: usize) -> Option<Rows> {
    bits.map(|b| Rows::from_mask(&mask(b, batch)))
}

/// A step of `s` on `model`, then each stepping row alone: the same bits; resting rows zeros.
fn step_transformer(model: &Transformer, s: &mut TrStream, bits: Option<u8>, t: usize, seed: u64) {
    let (b, d) = (s.alone.len(), model.config().d_model);
    let x = signal(seed, b * t * d);
    let rows = rows_of(bits, b);
    let stepping: Vec<usize> = rows
        .as_ref()
        .map_or((0..b).collect(), |r| r.indices().to_vec());
    let y = model.forward_host(
        (&mut s.state, &mut s.ws),
        HostArray::new(x.clone(), vec![b, t, d]),
        rows,
    );
    let y = y.expect("a valid step of a transformer stream");
    let n = t * d;
    for r in 0..b {
        let got = &y.data[r * n..(r + 1) * n];
        if !stepping.contains(&r) {
            assert!(
                got.iter().all(|&v| v == 0.0),
                "resting row {r} is not zeros"
            );
            continue;
        }
        let (st, ws) = &mut s.alone[r];
        let one = HostArray::new(x[r * n..(r + 1) * n].to_vec(), vec![1, t, d]);
        let want = model
            .forward_host((st, ws), one, None)
            .expect("a row alone steps");
        assert_eq!(
            bits_of(got),
            bits_of(&want.data),
            "row {r} differs from the row alone"
        );
    }
}

fn bits_of(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Stream `to` continues as `from` would, on its own model (same state shape).
fn copy_transformer(models: &[Transformer; 2], tr: &mut [TrStream; 2], from: usize) {
    let to = 1 - from;
    models[to]
        .check_state_source(&models[from])
        .expect("the two models' states fit");
    let state = models[to]
        .fitting(tr[from].state.deep_copy().unwrap())
        .unwrap();
    let alone: Vec<_> = (tr[from].alone.iter())
        .map(|(s, _)| {
            (
                models[to].fitting(s.deep_copy().unwrap()).unwrap(),
                Workspace::new(),
            )
        })
        .collect();
    tr[to] = TrStream {
        state,
        ws: Workspace::new(),
        alone,
    };
}

/// A codec's two streams of `batch` rows and each row's pair alone.
struct Pair {
    enc: EncodeStream,
    dec: DecodeStream,
    alone: Vec<(EncodeStream, DecodeStream)>,
}

impl Pair {
    fn new(c: &Codec, batch: usize) -> Self {
        let alone = (0..batch)
            .map(|_| (c.encode_stream(), c.decode_stream()))
            .collect();
        Pair {
            enc: c.encode_stream(),
            dec: c.decode_stream(),
            alone,
        }
    }

    fn fork(&self) -> Self {
        let copy =
            |e: &EncodeStream, d: &DecodeStream| (e.deep_copy().unwrap(), d.deep_copy().unwrap());
        let (enc, dec) = copy(&self.enc, &self.dec);
        let alone = self.alone.iter().map(|(e, d)| copy(e, d)).collect();
        Pair { enc, dec, alone }
    }

    fn reset_rows(&mut self, c: &Codec, rows: &[usize]) {
        self.enc.reset_rows(rows).unwrap();
        self.dec.reset_rows(rows).unwrap();
        for &r in rows {
            self.alone[r] = (c.encode_stream(), c.decode_stream());
        }
    }
}

/// One row of a `(b, k, t)` array.
fn row<T: Copy>(a: &HostArray<T>, r: usize) -> &[T] {
    let n = a.data.len() / a.shape[0];
    &a.data[r * n..(r + 1) * n]
}

/// An encode step of whole frames (a masked step takes whole frames), checked row by row.
fn encode(c: &Codec, p: &mut Pair, bits: Option<u8>, frames: usize, seed: u64) {
    let (b, n) = (p.alone.len(), frames * c.config().frame_size());
    let x = signal(seed, b * n);
    let rows = rows_of(bits, b);
    let stepping: Vec<usize> = rows
        .as_ref()
        .map_or((0..b).collect(), |r| r.indices().to_vec());
    let step = EncodeStep {
        active: rows,
        last: false,
    };
    let y = c.encode_step_host(&mut p.enc, HostArray::new(x.clone(), vec![b, 1, n]), step);
    let y = y.expect("a valid encode step");
    for r in 0..b {
        let got = y.as_ref().map(|y| row(y, r));
        if !stepping.contains(&r) {
            assert!(
                got.is_none_or(|g| g.iter().all(|&v| v == 0)),
                "resting row {r}: codes"
            );
            continue;
        }
        let one = HostArray::new(x[r * n..(r + 1) * n].to_vec(), vec![1, 1, n]);
        let want = c
            .encode_step_host(&mut p.alone[r].0, one, EncodeStep::default())
            .unwrap();
        assert_eq!(
            got,
            want.as_ref().map(|w| row(w, 0)),
            "row {r}'s codes differ alone"
        );
    }
}

/// A decode step of `frames` frames of codes, checked row by row (bits).
fn decode(c: &Codec, p: &mut Pair, bits: Option<u8>, frames: usize, seed: u64) {
    let (b, k) = (p.alone.len(), c.config().quantizer_n_q);
    let bins = c.config().quantizer_bins as f32;
    let codes: Vec<u32> = signal(seed, b * k * frames)
        .iter()
        .map(|v| ((v + 1.0) * 0.5 * bins) as u32 % bins as u32)
        .collect();
    let rows = rows_of(bits, b);
    let stepping: Vec<usize> = rows
        .as_ref()
        .map_or((0..b).collect(), |r| r.indices().to_vec());
    let y = c.decode_step_host(
        &mut p.dec,
        HostArray::new(codes.clone(), vec![b, k, frames]),
        rows,
    );
    let y = y.expect("a valid decode step");
    let per = k * frames;
    for r in 0..b {
        let got = y.as_ref().map(|y| bits_of(row(y, r)));
        if !stepping.contains(&r) {
            assert!(
                got.is_none_or(|g| g.iter().all(|&v| v == 0)),
                "resting row {r}: audio"
            );
            continue;
        }
        let one = HostArray::new(codes[r * per..(r + 1) * per].to_vec(), vec![1, k, frames]);
        let want = c.decode_step_host(&mut p.alone[r].1, one, None).unwrap();
        assert_eq!(
            got,
            want.map(|w| bits_of(&w.data)),
            "row {r}'s audio differs alone"
        );
    }
}

struct World {
    tr: [TrStream; 2],
    main: Pair,
    spare: Pair,
    batch: usize,
}

fn apply(w: &mut World, op: &Op) {
    let (models, c, b) = (small_transformers(), pico_codec(), w.batch);
    let rows = |bits: u8| (0..b).filter(|r| bits >> r & 1 == 1).collect::<Vec<_>>();
    match *op {
        Op::Step {
            which,
            mask,
            tokens,
            seed,
        } => {
            let (m, t) = (usize::from(which), usize::from(tokens % 3) + 1);
            step_transformer(&models[m], &mut w.tr[m], mask, t, u64::from(seed));
        }
        Op::ResetRows { which, rows: bits } => {
            let s = &mut w.tr[usize::from(which)];
            let r = rows(bits);
            s.state.reset_rows(&r);
            r.iter().for_each(|&r| s.alone[r] = Default::default());
        }
        Op::Reset { which } => w.tr[usize::from(which)] = fresh_transformer(b),
        Op::Copy { from } => copy_transformer(models, &mut w.tr, usize::from(from)),
        Op::Encode { mask, frames, seed } => {
            encode(c, &mut w.main, mask, usize::from(frames % 3), seed.into())
        }
        Op::Decode { mask, frames, seed } => decode(
            c,
            &mut w.main,
            mask,
            usize::from(frames % 2) + 1,
            seed.into(),
        ),
        Op::CodecResetRows { rows: bits } => w.main.reset_rows(c, &rows(bits)),
        Op::Fork => w.spare = w.main.fork(),
        Op::Swap => std::mem::swap(&mut w.main, &mut w.spare),
    }
}

fn fresh_transformer(b: usize) -> TrStream {
    let alone = (0..b).map(|_| Default::default()).collect();
    TrStream {
        alone,
        ..Default::default()
    }
}

fuzz_target!(|seq: Sequence| {
    let b = usize::from(seq.batch % 3) + 1;
    let c = pico_codec();
    let mut w = World {
        tr: [fresh_transformer(b), fresh_transformer(b)],
        main: Pair::new(c, b),
        spare: Pair::new(c, b),
        batch: b,
    };
    for op in seq.ops.iter().take(MAX_OPS) {
        apply(&mut w, op);
    }
});
