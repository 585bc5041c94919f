//! Chat templates (Jinja, as HF's `tokenizer_config.json`, `chat_template.jinja` and GGUF metadata
//! carry them), rendered in a sandbox: a template comes with a model from a stranger, so its work
//! and its output are bounded.
//!
//! | limit | default | raise with |
//! |---|---|---|
//! | instructions per render ("fuel") | 2,000,000 | `IPFS_ACCELERATE_TEMPLATE_FUEL` |
//! | rendered bytes | 16 MiB | `IPFS_ACCELERATE_TEMPLATE_MAX_BYTES` |
//!
//! minijinja itself caps `range()` at 100,000 items and a repeated string at 100 MB. Strings grown
//! by repeated concatenation inside a loop are bounded only through the fuel and the output cap.

use minijinja::value::Value;
use minijinja::{Environment, ErrorKind};

use crate::PreprocessError;

/// Default instruction budget of one render.
pub const DEFAULT_TEMPLATE_FUEL: u64 = 2_000_000;
/// Default largest rendered prompt, in bytes.
pub const DEFAULT_TEMPLATE_MAX_BYTES: usize = 16 << 20;

fn env_limit(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&v| v > 0)
        .unwrap_or(default)
}

/// The Python `str` methods HF chat templates call (`.upper()`, `.strip()`, ...).
fn python_methods(
    _: &minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, minijinja::Error> {
    let unknown = || {
        minijinja::Error::new(
            ErrorKind::UnknownMethod,
            format!("{method} is not a supported method"),
        )
    };
    let s = value.as_str().ok_or_else(unknown)?;
    let arg = |i: usize| args.get(i).and_then(Value::as_str).ok_or_else(unknown);
    Ok(match method {
        "upper" => Value::from(s.to_uppercase()),
        "lower" => Value::from(s.to_lowercase()),
        "strip" => Value::from(s.trim()),
        "lstrip" => Value::from(s.trim_start()),
        "rstrip" => Value::from(s.trim_end()),
        "startswith" => Value::from(s.starts_with(arg(0)?)),
        "endswith" => Value::from(s.ends_with(arg(0)?)),
        "replace" => Value::from(s.replace(arg(0)?, arg(1)?)),
        _ => return Err(unknown()),
    })
}

/// A writer that refuses to grow past `limit` bytes.
struct Bounded {
    out: Vec<u8>,
    limit: usize,
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.out.len() + buf.len() > self.limit {
            return Err(std::io::Error::other("output limit"));
        }
        self.out.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders `template` with `context` (HF's variables: `messages`, `add_generation_prompt`,
/// `bos_token`, ...) under the limits of this module. A template that runs out of fuel, renders
/// more than the byte limit, or fails is a [`PreprocessError::ChatTemplate`] naming the cause.
pub fn render_chat_template(template: &str, context: Value) -> Result<String, PreprocessError> {
    let fuel = env_limit("IPFS_ACCELERATE_TEMPLATE_FUEL", DEFAULT_TEMPLATE_FUEL);
    let max_bytes = env_limit(
        "IPFS_ACCELERATE_TEMPLATE_MAX_BYTES",
        DEFAULT_TEMPLATE_MAX_BYTES as u64,
    ) as usize;
    let bad = |e: minijinja::Error| {
        let reason = match e.kind() {
            ErrorKind::OutOfFuel => format!(
                "it ran past {fuel} instructions (raise IPFS_ACCELERATE_TEMPLATE_FUEL to allow more)"
            ),
            ErrorKind::WriteFailure => format!(
                "it rendered more than {max_bytes} bytes (raise IPFS_ACCELERATE_TEMPLATE_MAX_BYTES to allow more)"
            ),
            _ => e.to_string(),
        };
        PreprocessError::ChatTemplate(reason)
    };
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_unknown_method_callback(python_methods);
    env.add_template("chat", template).map_err(bad)?;
    let mut out = Bounded {
        out: Vec::new(),
        limit: max_bytes,
    };
    let template = env.get_template("chat").map_err(bad)?;
    template
        .render_captured_to(context, &mut out)
        .map(|_| ())
        .map_err(bad)?;
    String::from_utf8(out.out)
        .map_err(|_| PreprocessError::ChatTemplate("it rendered invalid UTF-8".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Value {
        minijinja::context! {
            messages => vec![minijinja::context! { role => "user", content => text }],
            add_generation_prompt => true,
        }
    }

    #[test]
    fn renders_a_chat_template() {
        let t = "{% for m in messages %}<|{{ m.role }}|>{{ m.content.strip() }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";
        assert_eq!(
            render_chat_template(t, user(" hi ")).unwrap(),
            "<|user|>hi<|assistant|>"
        );
    }

    #[test]
    fn hostile_templates_are_bounded() {
        // Nested loops: 10^10 iterations without fuel.
        let loops =
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}";
        let err = render_chat_template(loops, user("a"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("instructions"), "{err}");
        // One huge output from few instructions.
        let wide = "{% for i in range(100) %}{{ 'x' * 1000000 }}{% endfor %}";
        let err = render_chat_template(wide, user("a"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("bytes"), "{err}");
        // Syntax errors and unknown methods are errors, not panics.
        for t in [
            "{% for %}",
            "{{ messages[0].content.nope() }}",
            "{% include 'x' %}",
        ] {
            assert!(render_chat_template(t, user("a")).is_err(), "{t}");
        }
    }
}
