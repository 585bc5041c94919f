//! Speech recognition (Whisper or Wav2Vec2 CTC) of a WAV file:
//! `cargo run --example transcribe -- --model openai/whisper-tiny speech.wav`
mod common;

use ipfs_accelerate::speech::Transcriber;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("transcribe --model M FILE.wav [--backend B]", None)?;
    let asr = Transcriber::load(&args.model, &args.options)?;
    for file in &args.inputs {
        println!("{file}: {}", asr.transcribe_file(file)?.value.text);
    }
    Ok(())
}
