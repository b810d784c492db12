//! The host calls, what a binding hands any caller's arrays to: a structured input
//! (`arbitrary`) chooses calls on a small seeded codec and transformer, with any shape (also
//! values that do not fill it, or a shape checked for another input), values (NaN,
//! infinities, huge), codes (in and out of range), `lengths=`, `active=`, `rows=` and `last=`.
//! Every call gives a typed error, leaving its stream as it was, or a correct result: its
//! shape, codes in range, finite audio from finite input, and under `lengths=` each item
//! exactly as encoded alone.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mimi_core::codec::stream::{copy_pair, StreamPair};
use mimi_core::codec::{Input, Rows};
use mimi_core::host::HostInput;
use mimi_core::rows::RowSelection;
use mimi_core::transformer::{State, Workspace};
use mimi_core::{Codec, DecodeStream, EncodeStep, EncodeStream, HostArray};
use mimi_fuzz::{assert_typed, fill, pico_codec, small_transformers, Val};

/// A dimension: mostly small, sometimes one that overflows or exceeds every limit.
#[derive(Arbitrary, Clone, Copy, Debug)]
enum Dim {
    Small(u8),
    Huge,
    Max,
}

impl Dim {
    fn get(self) -> usize {
        match self {
            Dim::Small(d) => usize::from(d % 50),
            Dim::Huge => 1 << 31,
            Dim::Max => usize::MAX,
        }
    }
}

/// An array: its shape, its values (cycled to fill the shape, capped), and a change to its
/// length (values that do not fill the shape).
#[derive(Arbitrary, Debug)]
struct Array {
    shape: Vec<Dim>,
    vals: Vec<Val>,
    short: bool,
}

/// Most values an input holds (a larger shape is only ever refused).
const MAX_VALUES: usize = 4096;

impl Array {
    fn shape(&self) -> Vec<usize> {
        self.shape.iter().take(5).map(|d| d.get()).collect()
    }

    fn len(&self) -> Option<usize> {
        let n = self
            .shape()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))?;
        let n = n.checked_sub(usize::from(self.short && n > 0))?;
        (n <= MAX_VALUES).then_some(n)
    }

    fn pcm(&self) -> HostArray<f32> {
        let n = self.len().unwrap_or(MAX_VALUES.min(self.vals.len()));
        HostArray {
            data: fill(&self.vals, n),
            shape: self.shape(),
        }
    }

    /// Codes: each value's bits pick a code around the codebook's size (`bins` in range).
    fn codes(&self, bins: u32) -> HostArray<u32> {
        let n = self.len().unwrap_or(MAX_VALUES.min(self.vals.len()));
        let pick = |v: &Val| match v {
            Val::Small(i) => (*i as u8 as u32) % (bins + 2),
            Val::Max => u32::MAX,
            _ => bins - 1,
        };
        let data = match self.vals.len() {
            0 => vec![0; n],
            k => (0..n).map(|i| pick(&self.vals[i % k])).collect(),
        };
        HostArray {
            data,
            shape: self.shape(),
        }
    }

    fn finite_and_moderate(&self) -> bool {
        self.vals
            .iter()
            .all(|v| v.f32().is_finite() && v.f32().abs() <= 1e3)
    }
}

#[derive(Arbitrary, Debug)]
enum Selection {
    Mask(Vec<bool>),
    Indices(Vec<i64>),
}

impl Selection {
    fn get(&self) -> RowSelection {
        match self {
            Selection::Mask(m) => RowSelection::Mask(m.clone()),
            Selection::Indices(i) => RowSelection::Indices(i.clone()),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Call {
    Encode {
        pcm: Array,
        lengths: Option<Vec<u16>>,
        latents: bool,
    },
    Decode {
        codes: Array,
        lengths: Option<Vec<u16>>,
        latents: bool,
    },
    EncodeStep {
        pcm: Array,
        active: Option<Vec<bool>>,
        last: bool,
        shaped: Option<u8>,
    },
    DecodeStep {
        codes: Array,
        active: Option<Vec<bool>>,
    },
    Reset {
        rows: Option<Selection>,
    },
    Copy,
    Forward {
        x: Array,
        active: Option<Vec<bool>>,
        which: bool,
    },
    ResetTransformer {
        rows: Option<Selection>,
        which: bool,
    },
    CopyTransformer {
        from: bool,
    },
}

/// The streams the calls act on: the codec's pair and a transformer's for each of the two.
struct Streams {
    enc: Option<EncodeStream>,
    dec: Option<DecodeStream>,
    tr: [(State, Workspace); 2],
}

/// What a rejected call must leave as it was: every stream's batch and counts or positions.
fn snapshot(s: &Streams) -> Vec<Vec<u64>> {
    let mut out = vec![];
    let started = |b: Option<usize>, counts: &[u64]| match b {
        Some(b) => [vec![b as u64], counts.to_vec()].concat(),
        None => vec![u64::MAX],
    };
    out.push(
        s.enc
            .as_ref()
            .map_or(vec![u64::MAX], |e| started(e.batch(), e.counts())),
    );
    out.push(
        s.dec
            .as_ref()
            .map_or(vec![u64::MAX], |d| started(d.batch(), d.counts())),
    );
    for (st, _) in &s.tr {
        let b = st.batch().map_or(u64::MAX, |b| b as u64);
        out.push([vec![b], st.positions().to_vec()].concat());
    }
    out
}

fn lengths_of(l: &Option<Vec<u16>>) -> Option<Vec<usize>> {
    l.as_ref()
        .map(|l| l.iter().take(8).map(|&x| usize::from(x % 80)).collect())
}

/// An offline encode's codes are in range, of the call's shape, and under `lengths=` each
/// item's are exactly its own, alone, then zeros.
fn check_encode(c: &Codec, pcm: &HostArray<f32>, lengths: Option<&[usize]>, out: &HostArray<u32>) {
    let (b, n, k) = (pcm.shape[0], pcm.shape[2], c.config().quantizer_n_q);
    let frame = c.config().frame_size();
    // Under `lengths=` the output is as wide as the longest item (the documented rule).
    let width = lengths.map_or(n, |l| l.iter().copied().max().unwrap_or(0));
    assert_eq!(out.shape, [b, k, width.div_ceil(frame)], "encode's shape");
    let bins = c.config().quantizer_bins as u32;
    assert!(out.data.iter().all(|&x| x < bins), "a code out of range");
    let Some(lengths) = lengths else { return };
    let t = out.shape[2];
    for (i, &l) in lengths.iter().enumerate() {
        let ch = pcm.shape[1];
        let item = pcm.data[i * ch * n..(i + 1) * ch * n].to_vec();
        let mine: Vec<f32> = (0..ch)
            .flat_map(|j| item[j * n..j * n + l].to_vec())
            .collect();
        let alone = c.encode_host(HostArray::new(mine, vec![1, ch, l]), None, None);
        let alone = alone.expect("an item that encoded in a batch encodes alone");
        let tl = l.div_ceil(frame);
        for q in 0..k {
            let row = &out.data[(i * k + q) * t..(i * k + q + 1) * t];
            assert_eq!(
                &row[..tl],
                &alone.data[q * tl..(q + 1) * tl],
                "item {i} differs alone"
            );
            assert!(
                row[tl..].iter().all(|&x| x == 0),
                "item {i}: codes past its length"
            );
        }
    }
}

fn encode(c: &Codec, pcm: &Array, lengths: &Option<Vec<u16>>, latents: bool) -> bool {
    let (x, l) = (pcm.pcm(), lengths_of(lengths));
    if latents {
        return match c.encode_latents_host(x, l.as_deref(), None) {
            Ok(y) => {
                let finite = y.data.iter().all(|v| v.is_finite());
                assert!(!pcm.finite_and_moderate() || finite, "latents not finite");
                false
            }
            Err(e) => refused(&e, "encode_latents"),
        };
    }
    let mono = x.shape.len() == 1;
    match c.encode_host(x.clone(), l.as_deref(), None) {
        Ok(y) if mono => {
            assert_eq!(y.shape[..2], [1, c.config().quantizer_n_q]);
            false
        }
        Ok(y) => {
            check_encode(c, &x, l.as_deref(), &y);
            false
        }
        Err(e) => refused(&e, "encode"),
    }
}

fn decode(c: &Codec, codes: &Array, lengths: &Option<Vec<u16>>, latents: bool) -> bool {
    let bins = c.config().quantizer_bins as u32;
    let (x, l) = (codes.codes(bins), lengths_of(lengths));
    // Under `lengths=` the output is as wide as the longest item (the documented rule).
    let frames = |t: usize| {
        l.as_ref()
            .map_or(t, |l| l.iter().copied().max().unwrap_or(0))
    };
    let want = |ch: usize, per: usize| {
        (x.shape.len() == 3).then(|| [x.shape[0], ch, frames(x.shape[2]) * per])
    };
    let got = match latents {
        true => c
            .decode_latents_host(x.clone(), l.as_deref())
            .map(|y| (y, c.config().seanet.dimension, 1)),
        false => c
            .decode_host(x.clone(), l.as_deref(), None)
            .map(|y| (y, c.config().channels, c.config().frame_size())),
    };
    match got {
        Ok((y, ch, per)) => {
            assert_eq!(
                Some(y.shape.as_slice()),
                want(ch, per).as_ref().map(|w| &w[..]),
                "decode's shape"
            );
            assert!(
                y.data.iter().all(|v| v.is_finite()),
                "decoded audio is not finite"
            );
            false
        }
        Err(e) => refused(&e, "decode"),
    }
}

fn encode_step(
    c: &Codec,
    s: &mut Streams,
    pcm: &Array,
    active: &Option<Vec<bool>>,
    last: bool,
    shaped: Option<u8>,
) -> bool {
    let x = pcm.pcm();
    let input: HostInput<f32> = match shaped
        .map(|k| [Input::Pcm, Input::Codes, Input::CodesToDecode][usize::from(k % 3)])
    {
        Some(kind) => match c.input_shape(kind, &x.shape) {
            Ok(checked) => HostInput::Shaped(checked, x.data),
            Err(e) => return refused(&e, "input_shape"),
        },
        None => x.into(),
    };
    let step = EncodeStep {
        active: active.as_ref().map(|m| Rows::from_mask(m)),
        last,
    };
    let stream = s.enc.get_or_insert_with(|| c.encode_stream());
    let bins = c.config().quantizer_n_q;
    match c.encode_step_host(stream, input, step) {
        Ok(Some(y)) => {
            assert_eq!(y.shape[1], bins, "a step's codebooks");
            false
        }
        Ok(None) => false,
        Err(e) => refused(&e, "encode_step"),
    }
}

fn decode_step(c: &Codec, s: &mut Streams, codes: &Array, active: &Option<Vec<bool>>) -> bool {
    let x = codes.codes(c.config().quantizer_bins as u32);
    let stream = s.dec.get_or_insert_with(|| c.decode_stream());
    let rows = active.as_ref().map(|m| Rows::from_mask(m));
    match c.decode_step_host(stream, x, rows) {
        Ok(Some(y)) => {
            assert!(
                y.data.iter().all(|v| v.is_finite()),
                "decoded audio is not finite"
            );
            false
        }
        Ok(None) => false,
        Err(e) => refused(&e, "decode_step"),
    }
}

fn forward(s: &mut Streams, x: &Array, active: &Option<Vec<bool>>, which: bool) -> bool {
    let model = &small_transformers()[usize::from(which)];
    let (st, ws) = &mut s.tr[usize::from(which)];
    let rows = active.as_ref().map(|m| Rows::from_mask(m));
    match model.forward_host((st, ws), x.pcm(), rows) {
        Ok(y) => {
            assert_eq!(y.shape, x.shape(), "forward's shape");
            let ok = !x.finite_and_moderate() || y.data.iter().all(|v| v.is_finite());
            assert!(ok, "the transformer's output is not finite");
            false
        }
        Err(e) => refused(&e, "forward_host"),
    }
}

fn reset_transformer(s: &mut Streams, rows: &Option<Selection>, which: bool) -> bool {
    let (st, _) = &mut s.tr[usize::from(which)];
    match rows {
        None => {
            st.reset();
            false
        }
        Some(sel) => match sel.get().resolve(st.batch()) {
            Ok(r) => {
                st.reset_rows(&r);
                false
            }
            Err(e) => refused(&e, "reset_state(rows=)"),
        },
    }
}

fn copy_transformer(s: &mut Streams, from: bool) -> bool {
    let models = small_transformers();
    let (src, dst) = (usize::from(from), usize::from(!from));
    let copied = models[dst]
        .check_state_source(&models[src])
        .and_then(|()| models[dst].fitting(s.tr[src].0.deep_copy()?));
    match copied {
        Ok(state) => {
            s.tr[dst].0 = state;
            false
        }
        Err(e) => refused(&e, "copy_state"),
    }
}

/// Asserts that a refusal is typed; `true`: the call was rejected.
fn refused(e: &mimi_core::Error, what: &str) -> bool {
    assert_typed(e, what);
    true
}

fn reset_codec(s: &mut Streams, rows: &Option<Selection>) -> bool {
    let Some(sel) = rows else {
        (s.enc, s.dec) = (None, None);
        return false;
    };
    let mut pair = StreamPair {
        enc: &mut s.enc,
        dec: &mut s.dec,
    };
    match pair.reset_rows(&sel.get()) {
        Ok(()) => false,
        Err(e) => refused(&e, "reset_state(rows=)"),
    }
}

fn copy_codec(s: &mut Streams) -> bool {
    let copies = copy_pair(s.enc.as_ref(), s.dec.as_ref()).expect("a deep copy");
    let mut pair = StreamPair {
        enc: &mut s.enc,
        dec: &mut s.dec,
    };
    pair.replace(copies).expect("a stream's own copy fits it");
    false
}

/// Runs `call`; `true` if it was rejected.
fn run(c: &Codec, s: &mut Streams, call: &Call) -> bool {
    match call {
        Call::Encode {
            pcm,
            lengths,
            latents,
        } => encode(c, pcm, lengths, *latents),
        Call::Decode {
            codes,
            lengths,
            latents,
        } => decode(c, codes, lengths, *latents),
        Call::EncodeStep {
            pcm,
            active,
            last,
            shaped,
        } => encode_step(c, s, pcm, active, *last, *shaped),
        Call::DecodeStep { codes, active } => decode_step(c, s, codes, active),
        Call::Reset { rows } => reset_codec(s, rows),
        Call::Copy => copy_codec(s),
        Call::Forward { x, active, which } => forward(s, x, active, *which),
        Call::ResetTransformer { rows, which } => reset_transformer(s, rows, *which),
        Call::CopyTransformer { from } => copy_transformer(s, *from),
    }
}

fuzz_target!(|calls: Vec<Call>| {
    let c = pico_codec();
    let mut s = Streams {
        enc: None,
        dec: None,
        tr: Default::default(),
    };
    for call in calls.iter().take(12) {
        let before = snapshot(&s);
        let offline = matches!(call, Call::Encode { .. } | Call::Decode { .. });
        let rejected = run(c, &mut s, call);
        if rejected || offline {
            assert_eq!(before, snapshot(&s), "{call:?} changed a stream");
        }
    }
});
