//! The config door: arbitrary text into both config readers, a Hugging Face `config.json`
//! (`parse_hf_config`, what `Codec::open` reads beside a checkpoint) and mimi_py's own
//! dict of candle's fields (`CodecConfig::from_values` / `TransformerConfig::from_values`,
//! what `CodecConfig(**d)` and `TransformerConfig(**d)` call). Each either refuses the text
//! with a typed error or gives a config that validates and survives its own round trip
//! (`to_dict` then back), as pickling and `replace` rely on.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mimi_core::codec::checkpoint::{json_value, parse_hf_config};
use mimi_core::config::Value;
use mimi_core::{CodecConfig, TransformerConfig};
use mimi_fuzz::assert_typed;

/// An accepted codec config validates and reads back from its own values.
fn round_trip_codec(c: &CodecConfig, what: &str) {
    c.validate()
        .unwrap_or_else(|e| panic!("{what}: accepted an invalid config: {e}"));
    let values = c.values();
    let again = CodecConfig::from_values(values.iter().map(|(k, v)| (*k, v)))
        .unwrap_or_else(|e| panic!("{what}: its own values are refused: {e}"));
    assert_eq!(&again, c, "{what}: the round trip changed the config");
}

fn round_trip_transformer(c: &TransformerConfig) {
    let values = c.values();
    let again = TransformerConfig::from_values(values.iter().map(|(k, v)| (*k, v)))
        .unwrap_or_else(|e| panic!("a transformer config's own values are refused: {e}"));
    assert_eq!(&again, c, "the round trip changed the transformer config");
}

/// The whole door (text to config), then the same dict with a number of codebooks given.
fn hf_reader(text: &str, json: Option<&Value>) {
    match parse_hf_config(text, "config.json", None) {
        Ok(c) => round_trip_codec(&c, "config.json"),
        Err(e) => assert_typed(&e, "parse_hf_config"),
    }
    let Some(v @ Value::Dict(_)) = json else {
        return;
    };
    match CodecConfig::from_hf(v, Some(text.len() % 40)) {
        Ok(c) => round_trip_codec(&c, "config.json with num_codebooks"),
        Err(e) => assert_typed(&e, "from_hf"),
    }
}

fn dict_reader(v: &Value) {
    let Value::Dict(d) = v else {
        return;
    };
    let entries = || d.iter().map(|(k, v)| (k.as_str(), v));
    match CodecConfig::from_values(entries()) {
        Ok(c) => round_trip_codec(&c, "CodecConfig(**d)"),
        Err(e) => assert_typed(&e, "CodecConfig::from_values"),
    }
    match TransformerConfig::from_values(entries()) {
        Ok(c) => round_trip_transformer(&c),
        Err(e) => assert_typed(&e, "TransformerConfig::from_values"),
    }
    if let Some(inner) = v.get("transformer") {
        dict_reader(inner);
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let json = serde_json::from_str::<serde_json::Value>(text).ok();
    let value = json.as_ref().map(json_value);
    hf_reader(text, value.as_ref());
    if let Some(v) = &value {
        dict_reader(v);
    }
});
