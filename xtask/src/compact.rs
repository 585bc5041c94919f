//! `cargo xtask compact-model`: int8 copy (blocks of columns with f16 scales) of a checkpoint,
//! for the embedded default model.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use ipfs_accelerate::core::TensorSource;
use ipfs_accelerate_io::{quantize_blocks_i8, SafeTensorsFile, SCALE_SUFFIX};
use safetensors::tensor::{Dtype, TensorView};

/// Arguments of `compact-model`.
#[derive(clap::Args)]
pub struct Args {
    /// Source checkpoint directory (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    from: PathBuf,
    /// Output directory.
    #[arg(long)]
    out: PathBuf,
    /// Columns per scale (rows whose width it does not divide get one scale per row).
    #[arg(long, default_value_t = 64)]
    block: usize,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(&args.out)?;
    let src = SafeTensorsFile::open(args.from.join("model.safetensors"))?;
    let mut names = src.names();
    names.sort();
    let mut buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for name in names {
        let t = src.tensor(&name)?;
        if !t.dtype().is_float() {
            continue; // position_ids buffers and the like are recomputed by the model
        }
        let values = t.to_f32_vec();
        let shape = t.shape().to_vec();
        if shape.len() == 2 && shape[1] >= 16 {
            let block = if shape[1].is_multiple_of(args.block) {
                args.block
            } else {
                shape[1]
            };
            let (q, scales) = quantize_blocks_i8(&values, block);
            buffers.push((
                name.clone(),
                Dtype::I8,
                shape.clone(),
                q.iter().map(|v| *v as u8).collect(),
            ));
            buffers.push((
                format!("{name}{SCALE_SUFFIX}"),
                Dtype::F16,
                vec![shape[0], shape[1] / block],
                scales
                    .iter()
                    .flat_map(|s| half::f16::from_f32(*s).to_le_bytes())
                    .collect(),
            ));
        } else {
            buffers.push((
                name,
                Dtype::F32,
                shape,
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ));
        }
    }
    let views = buffers
        .iter()
        .map(|(n, d, s, b)| Ok((n.clone(), TensorView::new(*d, s.clone(), b)?)))
        .collect::<Result<Vec<_>, safetensors::SafeTensorError>>()?;
    let metadata = HashMap::from([(
        "format".to_string(),
        format!(
            "ipfs-accelerate int8 blocks of {} columns; `<name>{SCALE_SUFFIX}` holds f16 scales",
            args.block
        ),
    )]);
    let bytes = safetensors::serialize(views, Some(metadata))?;
    let out = args.out.join("model.safetensors");
    std::fs::write(&out, &bytes).with_context(|| out.display().to_string())?;
    for (from, to) in [
        ("config.json", "config.json"),
        ("tokenizer.json", "tokenizer.json"),
        ("1_Pooling/config.json", "pooling_config.json"),
    ] {
        std::fs::copy(args.from.join(from), args.out.join(to)).with_context(|| from.to_string())?;
    }
    println!(
        "wrote {} ({:.1} MB)",
        out.display(),
        bytes.len() as f64 / 1e6
    );
    Ok(ExitCode::SUCCESS)
}
