//! `cargo xtask verify`.

use std::path::PathBuf;
use std::process::ExitCode;

use ipfs_accelerate::conformance::{discover, implemented_families, verify_fixture_in, Check};
use ipfs_accelerate::{BackendKind, Precision};

/// Arguments of `verify`.
#[derive(clap::Args)]
pub struct Args {
    /// Fixture root holding `<family>/<variant>/` folders.
    #[arg(long, default_value = "../shared/fixtures")]
    fixtures: PathBuf,
    /// Comma-separated families to check (default: every family found).
    #[arg(long, value_delimiter = ',')]
    family: Vec<String>,
    /// Comma-separated backends to run on.
    #[arg(long, value_delimiter = ',', default_value = "cpu")]
    backend: Vec<String>,
    /// The float type the native backends compute in: f32 (default), f16 or bf16. The bars
    /// loosen to at least 1e-2 (f16) / 5e-2 (bf16); integer outputs must still match.
    #[arg(long, default_value = "f32")]
    precision: Precision,
    /// Kernel fusion on the CubeCL backends (cuda, wgpu): `on` or `off` (default: on, or what
    /// `IPFS_ACCELERATE_FUSION` says).
    #[arg(long, value_parser = ipfs_accelerate::parse_switch)]
    fusion: Option<bool>,
    /// Also print the results as JSON lines.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(on) = args.fusion {
        ipfs_accelerate::set_kernel_fusion(on);
    }
    let backends = args
        .backend
        .iter()
        .map(|b| b.parse::<BackendKind>())
        .collect::<Result<Vec<_>, _>>()?;
    let fixtures = discover(&args.fixtures, &args.family)?;
    if fixtures.is_empty() {
        anyhow::bail!(
            "no fixtures found under {} for families {:?}",
            args.fixtures.display(),
            args.family
        );
    }
    let implemented = implemented_families();
    let mut checks: Vec<Check> = Vec::new();
    let mut skipped = std::collections::BTreeSet::new();
    let mut no_export = Vec::new();
    for fixture in &fixtures {
        if !implemented.contains(&fixture.family.as_str()) {
            skipped.insert(fixture.family.clone());
            continue;
        }
        for &backend in &backends {
            if matches!(backend, BackendKind::Onnx(_) | BackendKind::Browser(_))
                && !fixture.has_onnx_export()
            {
                no_export.push(format!(
                    "{}/{} on {backend}",
                    fixture.family, fixture.variant
                ));
                continue;
            }
            match verify_fixture_in(fixture, backend, args.precision) {
                Ok(c) => checks.extend(c),
                Err(e) => checks.push(Check {
                    family: fixture.family.clone(),
                    variant: fixture.variant.clone(),
                    backend: backend.to_string(),
                    output: "-".into(),
                    rel_error: f64::INFINITY,
                    tolerance: 0.0,
                    ok: false,
                    note: e.to_string(),
                }),
            }
        }
    }
    // On cuda the decoder also computes on ggml block weights: each format against the same
    // engine on the dequantized values (a random model; the fixtures are too narrow for the
    // 256-weight k-quant blocks).
    let decoders = ["llama", "qwen2"];
    if backends.contains(&BackendKind::Cuda)
        && (args.family.is_empty() || args.family.iter().any(|f| decoders.contains(&f.as_str())))
    {
        checks.extend(ipfs_accelerate::conformance::verify_block_formats(
            args.precision,
        ));
    }
    println!(
        "{:<10} {:<26} {:<12} {:<20} {:>12} {:>10}  ok",
        "family", "variant", "backend", "output", "rel_error", "tolerance"
    );
    for c in &checks {
        println!(
            "{:<10} {:<26} {:<12} {:<20} {:>12.3e} {:>10.1e}  {}{}",
            c.family,
            c.variant,
            c.backend,
            c.output,
            c.rel_error,
            c.tolerance,
            if c.ok { "ok" } else { "FAIL" },
            if c.note.is_empty() {
                String::new()
            } else {
                format!("  ({})", c.note)
            }
        );
        if args.json {
            println!("{}", serde_json::to_string(c)?);
        }
    }
    for what in &no_export {
        println!("skipped {what}: the fixture has no ONNX export");
    }
    for family in &skipped {
        println!("skipped family `{family}`: not implemented yet");
    }
    let failed = checks.iter().filter(|c| !c.ok).count();
    println!("{} passed, {} failed", checks.len() - failed, failed);
    Ok(if failed == 0 && !checks.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
