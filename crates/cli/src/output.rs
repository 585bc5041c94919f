//! How every command prints its result (`--format`): the command's own form, one JSON document
//! with the metrics, or plain text lines.

use ipfs_accelerate::{Metrics, Output};
use serde::Serialize;
use serde_json::{json, Value};

/// The output format of a command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// The command's own form: JSON for structured results (vectors, labels, boxes), plain
    /// text streamed as it is generated for text.
    #[default]
    Auto,
    /// One JSON document on stdout: `{"model", "backend", "result", "metrics"}` (times in ms).
    Json,
    /// Plain text: one line per item (a vector's values, a label and its score, ...).
    Text,
}

/// The command's own form of a result under [`Format::Auto`].
pub(crate) enum Native {
    /// Compact JSON on one line (vectors).
    Json,
    /// Pretty-printed JSON (labels, answers, boxes).
    PrettyJson,
    /// Text the command already printed (streamed generation).
    Printed,
    /// Lines of text.
    Lines(Vec<String>),
}

/// The metrics as JSON: the backend, the phases in ms, the counts and the rates.
pub(crate) fn metrics_json(m: &Metrics) -> Value {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    json!({
        "backend": m.backend,
        "init_ms": ms(m.init),
        "preprocess_ms": ms(m.preprocess),
        "inference_ms": ms(m.inference),
        "postprocess_ms": ms(m.postprocess),
        "total_ms": ms(m.total),
        "items": m.items,
        "tokens": m.tokens,
        "truncated": m.truncated,
        "items_per_s": m.items_per_second(),
        "tokens_per_s": m.tokens_per_second(),
        "memory_bytes": m.memory_bytes,
    })
}

/// Prints `result` of `model` in `format` (`native` under [`Format::Auto`]).
pub(crate) fn emit(
    format: Format,
    native: Native,
    model: &str,
    result: &impl Serialize,
    metrics: &Metrics,
) -> anyhow::Result<()> {
    match format {
        Format::Json => {
            let doc = json!({
                "model": model,
                "backend": metrics.backend,
                "result": result,
                "metrics": metrics_json(metrics),
            });
            println!("{}", serde_json::to_string(&doc)?);
        }
        Format::Text => match native {
            Native::Printed => {}
            Native::Lines(lines) => lines.iter().for_each(|l| println!("{l}")),
            Native::Json | Native::PrettyJson => {
                let mut lines = Vec::new();
                text_lines(&serde_json::to_value(result)?, &mut lines);
                lines.iter().for_each(|l| println!("{l}"));
            }
        },
        Format::Auto => match native {
            Native::Printed => {}
            Native::Lines(lines) => lines.iter().for_each(|l| println!("{l}")),
            Native::Json => println!("{}", serde_json::to_string(result)?),
            Native::PrettyJson => println!("{}", serde_json::to_string_pretty(result)?),
        },
    }
    Ok(())
}

/// [`emit`] of a task's output; returns its metrics.
pub(crate) fn emit_output<T: Serialize>(
    format: Format,
    native: Native,
    model: &str,
    out: Output<T>,
) -> anyhow::Result<Metrics> {
    emit(format, native, model, &out.value, &out.metrics)?;
    Ok(out.metrics)
}

/// One scalar as text.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// A flat object as `key=value` pairs separated by tabs (nested values as compact JSON).
fn object_line(map: &serde_json::Map<String, Value>) -> String {
    map.iter()
        .map(|(k, v)| match v {
            Value::Array(_) | Value::Object(_) => format!("{k}={v}"),
            other => format!("{k}={}", scalar(other)),
        })
        .collect::<Vec<_>>()
        .join("\t")
}

/// Text lines of a JSON value: a list of numbers is one line of space-separated values, a list
/// of lists one line per inner list (recursively), an object one line of `key=value` pairs, a
/// list of objects one line each; lists of results per input are separated by blank lines.
pub(crate) fn text_lines(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Array(items) if items.iter().all(|i| !i.is_array() && !i.is_object()) => {
            out.push(items.iter().map(scalar).collect::<Vec<_>>().join(" "));
        }
        Value::Array(items) => {
            let nested = items.iter().any(|i| {
                i.as_array()
                    .is_some_and(|a| a.iter().any(|x| x.is_object() || x.is_array()))
            });
            for (n, item) in items.iter().enumerate() {
                if nested && n > 0 {
                    out.push(String::new());
                }
                text_lines(item, out);
            }
        }
        Value::Object(map) => out.push(object_line(map)),
        other => out.push(scalar(other)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_lines_of_vectors_labels_and_nested_results() {
        let mut out = Vec::new();
        text_lines(&json!([[1.0, 2.5], [3.0, 4.0]]), &mut out);
        assert_eq!(out, ["1.0 2.5", "3.0 4.0"]);
        out.clear();
        text_lines(
            &json!([[{"label": "a", "score": 0.9}], [{"label": "b", "score": 0.1}]]),
            &mut out,
        );
        assert_eq!(out, ["label=a\tscore=0.9", "", "label=b\tscore=0.1"]);
        out.clear();
        text_lines(&json!({"answer": "Paris", "start": 3}), &mut out);
        assert_eq!(out, ["answer=Paris\tstart=3"]);
    }
}
