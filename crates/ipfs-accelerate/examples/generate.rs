//! Text generation from a GGUF file or a LLaMA / Qwen2 checkpoint, streamed:
//! `cargo run --example generate -- --model SmolLM2-135M-Instruct.Q4_1.gguf "The capital of France is"`
mod common;

use std::io::Write;

use ipfs_accelerate::text::{GenerateOptions, TextGenerator};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args(
        "generate --model M PROMPT [--backend B] [--precision f32|f16|bf16]",
        None,
    )?;
    let generator = TextGenerator::load(&args.model, &args.options)?;
    let options = GenerateOptions {
        max_new_tokens: 32,
        ..Default::default()
    };
    let out = generator.generate(&args.inputs.join(" "), &options, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    eprintln!(
        "{:.1} tokens/s on {}",
        out.value.decode_tokens_per_s, out.metrics.backend
    );
    Ok(())
}
