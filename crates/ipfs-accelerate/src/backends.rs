//! The backends compiled into this build, and dispatch from a run-time [`BackendKind`] to the
//! compile-time burn backend type.

use std::sync::atomic::{AtomicU8, Ordering};

use ipfs_accelerate_core::{Availability, BackendKind, Precision, ProbeBackend, Selector};

use crate::{Error, Result};

/// Every backend compiled into this build.
#[allow(clippy::vec_init_then_push)] // one push per backend feature
pub fn compiled_backends() -> Vec<Box<dyn ProbeBackend>> {
    #[allow(unused_mut)]
    let mut v: Vec<Box<dyn ProbeBackend>> = Vec::new();
    #[cfg(feature = "cuda")]
    v.push(Box::new(
        ipfs_accelerate_backend_cuda::CudaBackend::default(),
    ));
    #[cfg(feature = "rocm")]
    v.push(Box::new(
        ipfs_accelerate_backend_rocm::RocmBackend::default(),
    ));
    // one backend under both kinds: `wgpu` (native API) and `webgpu` (same adapter and kernels)
    #[cfg(feature = "wgpu")]
    v.extend([BackendKind::Wgpu, BackendKind::WebGpu].map(|kind| {
        Box::new(ipfs_accelerate_backend_wgpu::WgpuBackend::new(kind)) as Box<dyn ProbeBackend>
    }));
    // the same backend on Metal adapters only, with MSL kernels
    #[cfg(feature = "metal")]
    v.push(Box::new(ipfs_accelerate_backend_wgpu::WgpuBackend::new(
        BackendKind::Metal,
    )));
    #[cfg(feature = "cpu")]
    v.push(Box::new(ipfs_accelerate_backend_cpu::CpuBackend));
    #[cfg(feature = "onnx")]
    v.extend(
        ipfs_accelerate_backend_onnx::OnnxBackend::all()
            .into_iter()
            .map(|b| Box::new(b) as Box<dyn ProbeBackend>),
    );
    #[cfg(feature = "webnn")]
    v.extend(
        ipfs_accelerate_backend_webnn::BrowserBackend::all()
            .into_iter()
            .map(|b| Box::new(b) as Box<dyn ProbeBackend>),
    );
    v
}

/// A selector over the compiled-in backends.
pub fn selector() -> Selector {
    Selector::new(compiled_backends())
}

/// Probe results for every backend kind (compiled in or not), as `devices` prints them; the
/// CPU's driver line names the int8 / bf16 kernels chosen for this CPU.
pub fn devices() -> Vec<(BackendKind, Availability)> {
    let mut rows = selector().probe_all();
    for (kind, availability) in &mut rows {
        if let (BackendKind::Cpu, Availability::Available(info)) = (*kind, availability) {
            let kernels = ipfs_accelerate_nn::fast::cpu_kernels();
            info.driver = Some(match info.driver.take() {
                Some(d) => format!("{d}; kernels: {kernels}"),
                None => format!("kernels: {kernels}"),
            });
        }
    }
    rows
}

/// Every native (burn) backend compiled into this build, fastest first, the CPU last. Backends that
/// are not compiled in are left out (naming one explicitly reports it as skipped, with the feature
/// to enable); so are the ONNX Runtime and browser kinds, which need an ONNX export of the model
/// and are used when named (`--backend onnx-openvino`, `--backend webnn`).
pub fn compiled_preferences() -> Vec<BackendKind> {
    let compiled: Vec<BackendKind> = compiled_backends().iter().map(|b| b.kind()).collect();
    BackendKind::all()
        .into_iter()
        .filter(|k| {
            compiled.contains(k) && !matches!(k, BackendKind::Onnx(_) | BackendKind::Browser(_))
        })
        .collect()
}

/// The default preference order: `IPFS_ACCELERATE_BACKENDS` when set, else
/// [`compiled_preferences`].
pub fn default_preferences() -> Result<Vec<BackendKind>> {
    match backends_from_env() {
        Some(list) => Ok(BackendKind::parse_list(&list)?),
        None => Ok(compiled_preferences()),
    }
}

/// The non-empty value of `IPFS_ACCELERATE_BACKENDS`.
pub(crate) fn backends_from_env() -> Option<String> {
    std::env::var(crate::BACKENDS_ENV)
        .ok()
        .filter(|v| !v.trim().is_empty())
}

/// The preference list of a pipeline: `IPFS_ACCELERATE_BACKENDS` when set and `env_override` allows
/// it, else `explicit`, else [`compiled_preferences`].
pub(crate) fn resolve_preferences(
    explicit: Option<Vec<BackendKind>>,
    env_override: bool,
) -> Result<Vec<BackendKind>> {
    let from_env = backends_from_env().filter(|_| env_override);
    Ok(match (from_env, explicit) {
        (Some(list), _) => BackendKind::parse_list(&list)?,
        (None, Some(b)) => b,
        (None, None) => compiled_preferences(),
    })
}

/// Probes `preferences` in order and runs the load `work` (made fresh per attempt) on the first
/// usable backend in `precision`; a backend whose load fails (a precision it does not compute in
/// included) is recorded as skipped with the error and the next one is tried.
pub(crate) fn load_on_first_usable<W: WithBackend>(
    preferences: &[BackendKind],
    precision: Precision,
    mut work: impl FnMut() -> W,
) -> Result<(W::Output, ipfs_accelerate_core::Selection)> {
    let (usable, mut skipped) = selector().candidates(preferences);
    for device in usable {
        match with_backend(device.kind, precision, work()) {
            Ok(out) => return Ok((out, ipfs_accelerate_core::Selection { device, skipped })),
            Err(e) => {
                tracing::warn!(backend = %device.kind, error = %e, "load failed, trying the next backend");
                skipped.push(ipfs_accelerate_core::SkippedBackend {
                    kind: device.kind,
                    reason: format!("load failed: {e}"),
                });
            }
        }
    }
    let reasons = skipped
        .iter()
        .map(|s| format!("{}: {}", s.kind, s.reason))
        .collect::<Vec<_>>()
        .join("; ");
    Err(Error::LoadFailed(if reasons.is_empty() {
        "the preference list is empty".into()
    } else {
        reasons
    }))
}

/// Whether `kind` runs an ONNX graph (ONNX Runtime or a browser) instead of loading weights.
pub(crate) fn is_graph_backend(kind: BackendKind) -> bool {
    matches!(kind, BackendKind::Onnx(_) | BackendKind::Browser(_))
}

/// The selection of the graph backend `kind` for a load asking for `quantization` and
/// `precision`, or why it cannot take it: graph backends run the checkpoint's f32 export, and
/// the backend must be usable here.
#[allow(dead_code)] // used by the task types with a graph path
pub(crate) fn graph_selection(
    kind: BackendKind,
    quantization: ipfs_accelerate_nn::WeightQuantization,
    precision: Precision,
) -> std::result::Result<ipfs_accelerate_core::Selection, String> {
    if quantization != ipfs_accelerate_nn::WeightQuantization::None || precision != Precision::F32 {
        return Err(format!(
            "{kind} runs the checkpoint's f32 ONNX export: quantization and precision apply to \
             the native backends"
        ));
    }
    usable_selection(kind)
}

/// The selection of `kind` with nothing skipped when it is usable here, else why not.
pub(crate) fn usable_selection(
    kind: BackendKind,
) -> std::result::Result<ipfs_accelerate_core::Selection, String> {
    match selector().probe(kind) {
        Availability::Available(device) => Ok(ipfs_accelerate_core::Selection {
            device,
            skipped: Vec::new(),
        }),
        other => Err(other.reason(kind).unwrap_or_else(|| "unavailable".into())),
    }
}

/// Loads on the first of `preferences` that works, in their order: the graph backends (ONNX
/// Runtime, browsers) one at a time through `graph`, each run of native backends through
/// `native` (which picks the first usable of the run). Every failure before the one that loads
/// is in the selection's `skipped`, with its reason.
pub(crate) fn load_in_order<O>(
    preferences: &[BackendKind],
    mut native: impl FnMut(&[BackendKind]) -> Result<(O, ipfs_accelerate_core::Selection)>,
    mut graph: impl FnMut(
        BackendKind,
    ) -> std::result::Result<(O, ipfs_accelerate_core::Selection), String>,
) -> Result<(O, ipfs_accelerate_core::Selection)> {
    let mut skipped = Vec::new();
    let mut run: Vec<BackendKind> = Vec::new();
    let finish = |(out, mut selection): (O, ipfs_accelerate_core::Selection),
                  mut skipped: Vec<ipfs_accelerate_core::SkippedBackend>| {
        skipped.append(&mut selection.skipped);
        selection.skipped = skipped;
        (out, selection)
    };
    for (i, &kind) in preferences.iter().enumerate() {
        if !is_graph_backend(kind) {
            run.push(kind);
            let last_native = preferences[i + 1..].iter().all(|k| !is_graph_backend(*k));
            if last_native {
                continue;
            }
            // The native preferences before a graph one are tried before it.
            match native(&run) {
                Ok(found) => return Ok(finish(found, skipped)),
                Err(e) => {
                    skipped.extend(
                        run.iter()
                            .map(|&kind| ipfs_accelerate_core::SkippedBackend {
                                kind,
                                reason: e.to_string(),
                            }),
                    )
                }
            }
            run.clear();
            continue;
        }
        match graph(kind) {
            Ok(found) => return Ok(finish(found, skipped)),
            Err(reason) => skipped.push(ipfs_accelerate_core::SkippedBackend { kind, reason }),
        }
    }
    if !run.is_empty() {
        return native(&run).map(|found| finish(found, skipped));
    }
    Err(Error::LoadFailed(if skipped.is_empty() {
        "the preference list is empty".into()
    } else {
        skipped
            .iter()
            .map(|s| format!("{}: {}", s.kind, s.reason))
            .collect::<Vec<_>>()
            .join("; ")
    }))
}

/// The process-wide fusion setting: 0 = unset (the environment decides), 1 = on, 2 = off.
static FUSION: AtomicU8 = AtomicU8::new(0);

/// The environment variable that turns kernel fusion off on the CubeCL backends (`0` / `off`).
pub const FUSION_ENV: &str = "IPFS_ACCELERATE_FUSION";
/// The environment variable that lets CUDA's f32 matmuls round to TF32 (`1`): faster, and off by
/// default because outputs then move by up to a few percent from HF's f32 ones.
pub const TF32_ENV: &str = "IPFS_ACCELERATE_TF32";

/// Turns kernel fusion on or off for the CubeCL backends (cuda, wgpu) in the loads that follow,
/// in this process (models already loaded keep theirs). The default is on, unless
/// `IPFS_ACCELERATE_FUSION` is `0`, `false` or `off`. With fusion, burn records tensor ops and
/// compiles chains of element-wise work (and the element-wise work around matmuls and
/// reductions) into single kernels; without it every op is its own kernel.
pub fn set_kernel_fusion(on: bool) {
    FUSION.store(if on { 1 } else { 2 }, Ordering::Relaxed);
}

/// Whether loads on the CubeCL backends use kernel fusion ([`set_kernel_fusion`]).
pub fn kernel_fusion() -> bool {
    match FUSION.load(Ordering::Relaxed) {
        1 => true,
        2 => false,
        _ => env_switch(FUSION_ENV).unwrap_or(true),
    }
}

/// The environment variable that turns the cuBLAS encoder off (`0` / `off`): BERT on `cuda` then
/// runs on burn's CubeCL kernels like every other family.
pub const CUBLAS_ENV: &str = "IPFS_ACCELERATE_CUBLAS";

/// Whether BERT checkpoints on `cuda` run on the cuBLAS encoder (`ipfs-accelerate-backend-cublas`)
/// when it can take them: on unless `IPFS_ACCELERATE_CUBLAS` is `0`, `false` or `off`.
pub fn cublas_encoder() -> bool {
    env_switch(CUBLAS_ENV).unwrap_or(true)
}

/// BERT on the cuBLAS encoder, from a configuration and any weight source (a folder's files, the
/// embedded model's bytes), or why it cannot run there (a task head, bf16, a missing library): the
/// caller falls back to burn's CubeCL path and logs the reason.
#[cfg(all(feature = "cuda", feature = "bert"))]
pub(crate) fn cublas_bert_from(
    config: &ipfs_accelerate_bert::BertConfig,
    weights: std::sync::Arc<dyn ipfs_accelerate_core::TensorSource>,
    precision: Precision,
) -> std::result::Result<Box<dyn ipfs_accelerate_core::ModelRunner>, String> {
    if !matches!(precision, Precision::F32 | Precision::F16) {
        return Err(format!("it runs f32 and f16, not {precision}"));
    }
    let spec =
        ipfs_accelerate_bert::encoder_spec_from(config, weights).map_err(|e| e.to_string())?;
    let runner = ipfs_accelerate_backend_cublas::EncoderRunner::load(&spec, precision)
        .map_err(|e| e.to_string())?;
    Ok(Box::new(runner))
}

/// The [`ipfs_accelerate_core::EncoderSpec`] of the `family` checkpoint in `dir`: an
/// `InvalidInput` error for the families it has no spec for here (it has BERT's, ViT's and
/// Wav2Vec2's).
#[cfg(feature = "cuda")]
pub(crate) fn encoder_spec_of(
    family: &str,
    dir: &std::path::Path,
) -> ipfs_accelerate_core::Result<ipfs_accelerate_core::EncoderSpec> {
    let _ = dir;
    match family {
        #[cfg(feature = "bert")]
        "bert" => ipfs_accelerate_bert::encoder_spec(dir),
        #[cfg(feature = "vit")]
        "vit" => ipfs_accelerate_vit::encoder_spec(dir),
        #[cfg(feature = "wav2vec2")]
        "wav2vec2" => {
            use ipfs_accelerate_core::JsonConfig;
            let config =
                ipfs_accelerate_wav2vec2::Wav2Vec2Config::from_file(&dir.join("config.json"))?;
            let weights = ipfs_accelerate_io::open_weights(dir)?;
            ipfs_accelerate_wav2vec2::encoder_spec(&config, weights.as_ref())
        }
        other => Err(ipfs_accelerate_core::Error::InvalidInput(format!(
            "the encoder spec describes bert, vit and wav2vec2, not {other}"
        ))),
    }
}

/// A checkpoint's [`ipfs_accelerate_core::EncoderSpec`] (from `spec`) on the cuBLAS encoder, for
/// a task type loading on `kind`: why not when `kind` is not `cuda`, the encoder is switched off,
/// the options ask for quantized weights or another precision than f32 / f16, the spec cannot
/// describe the checkpoint, or a library or the device is missing (the runner probes them).
#[cfg(feature = "cuda")]
pub(crate) fn cublas_encoder_for(
    kind: BackendKind,
    options: &crate::LoadOptions,
    spec: impl FnOnce() -> ipfs_accelerate_core::Result<ipfs_accelerate_core::EncoderSpec>,
) -> std::result::Result<Box<dyn ipfs_accelerate_core::ModelRunner>, String> {
    if kind != BackendKind::Cuda {
        return Err(format!("the cuBLAS encoder runs on cuda, not {kind}"));
    }
    if !cublas_encoder() {
        return Err(format!("{CUBLAS_ENV} is off"));
    }
    if options.quantization != ipfs_accelerate_nn::WeightQuantization::None {
        return Err("it keeps float weights (no quantization)".into());
    }
    if !matches!(options.precision, Precision::F32 | Precision::F16) {
        return Err(format!("it runs f32 and f16, not {}", options.precision));
    }
    let spec = spec().map_err(|e| e.to_string())?;
    let runner = ipfs_accelerate_backend_cublas::EncoderRunner::load(&spec, options.precision)
        .map_err(|e| e.to_string())?;
    Ok(Box::new(runner))
}

/// One tower of a model that burn loads (`family`'s `tower`, its spec from `spec`) on the cuBLAS
/// encoder, as [`cublas_encoder_for`] loads it; `None` with the reason logged when it cannot
/// (burn then runs that tower).
#[cfg(all(feature = "cuda", any(feature = "clap", feature = "xclip")))]
pub(crate) fn cublas_tower(
    kind: BackendKind,
    options: &crate::LoadOptions,
    (family, tower, dir): (&str, &str, &std::path::Path),
    spec: impl FnOnce() -> ipfs_accelerate_core::Result<ipfs_accelerate_core::EncoderSpec>,
) -> Option<Box<dyn ipfs_accelerate_core::ModelRunner>> {
    match cublas_encoder_for(kind, options, spec) {
        Ok(engine) => Some(engine),
        Err(reason) => {
            tracing::info!(
                "{family} on {kind}: the cuBLAS encoder cannot run the {tower} tower of {} \
                 ({reason}); burn runs it",
                dir.display()
            );
            None
        }
    }
}

/// `load` (a model wholly on the cuBLAS engines) when `kind` is `cuda`; `None` on other backends
/// and when it cannot take the checkpoint in `dir`, the reason logged (the caller then loads on
/// burn: `fallback` says how).
#[cfg(all(
    feature = "cuda",
    any(feature = "whisper", feature = "t5", feature = "llava")
))]
pub(crate) fn cublas_engines<T>(
    kind: BackendKind,
    family: &str,
    dir: &std::path::Path,
    fallback: &str,
    load: impl FnOnce() -> std::result::Result<T, String>,
) -> Option<T> {
    if kind != BackendKind::Cuda {
        return None;
    }
    match load() {
        Ok(model) => Some(model),
        Err(reason) => {
            tracing::info!(
                "{family} on cuda: the cuBLAS engines cannot run {} ({reason}); {fallback}",
                dir.display()
            );
            None
        }
    }
}

/// CLIP on the cuBLAS encoder: both towers' specs ([`ipfs_accelerate_clip::encoder_specs`]) each
/// on the engine, combined into `CLIPModel`'s outputs by [`ipfs_accelerate_clip::TowerRunner`];
/// why not, as [`cublas_encoder_for`] says it (images must be of the checkpoint's size).
#[cfg(all(feature = "cuda", feature = "clip"))]
pub(crate) fn cublas_clip(
    kind: BackendKind,
    dir: &std::path::Path,
    options: &crate::LoadOptions,
) -> std::result::Result<ipfs_accelerate_clip::TowerRunner, String> {
    use ipfs_accelerate_core::JsonConfig;
    if kind != BackendKind::Cuda {
        return Err(format!("the cuBLAS encoder runs on cuda, not {kind}"));
    }
    let specs = ipfs_accelerate_clip::ClipConfig::from_file(&dir.join("config.json"))
        .and_then(|config| {
            let (text, vision, scale) = ipfs_accelerate_clip::encoder_specs(
                &config,
                ipfs_accelerate_io::open_weights(dir)?,
            )?;
            Ok((config, text, vision, scale))
        })
        .map_err(|e| e.to_string())?;
    let (config, text, vision, scale) = specs;
    let text = cublas_encoder_for(kind, options, || Ok(text))?;
    let vision = cublas_encoder_for(kind, options, || Ok(vision))?;
    Ok(ipfs_accelerate_clip::TowerRunner::new(
        text, vision, config, scale,
    ))
}

/// Whether `IPFS_ACCELERATE_TF32` allows TF32 matmuls.
fn tf32_allowed() -> bool {
    env_switch(TF32_ENV).unwrap_or(false)
}

/// Parses a switch: `on` / `off` (and `1` / `0`, `true` / `false`), as the `--fusion` flags and
/// the switch variables take it.
pub fn parse_switch(s: &str) -> std::result::Result<bool, String> {
    match s.trim().to_ascii_lowercase().as_str() {
        "on" | "1" | "true" => Ok(true),
        "off" | "0" | "false" => Ok(false),
        other => Err(format!("expected on or off, got `{other}`")),
    }
}

/// The switch the environment variable `name` sets ([`parse_switch`]); `None` when it is unset or
/// not a switch.
pub(crate) fn env_switch(name: &str) -> Option<bool> {
    parse_switch(&std::env::var(name).ok()?).ok()
}

/// Work that needs a concrete backend type: implemented once, run on whichever backend is chosen.
pub(crate) trait WithBackend {
    type Output;
    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output>;

    /// The work done on `kind` by an engine that needs no burn device (the cuBLAS decoder on
    /// cuda), before the device is set up: `Ok` is the answer, `Err` hands the work back to run
    /// on burn's device (whose precision is then fixed for the process).
    fn without_device(self, kind: BackendKind) -> std::result::Result<Result<Self::Output>, Self>
    where
        Self: Sized,
    {
        let _ = kind;
        Err(self)
    }
}

/// Runs `work` on the backend `kind` in `precision`, if it is compiled in.
pub(crate) fn with_backend<W: WithBackend>(
    kind: BackendKind,
    precision: Precision,
    work: W,
) -> Result<W::Output> {
    let work = match work.without_device(kind) {
        Ok(out) => return out,
        Err(work) => work,
    };
    match kind {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => run_in(&ipfs_accelerate_backend_cpu::CpuBackend, precision, work),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => {
            use ipfs_accelerate_backend_cuda::CudaBackend;
            fused_or_not(
                CudaBackend::new(0),
                CudaBackend::unfused(0),
                precision,
                work,
            )
        }
        #[cfg(feature = "rocm")]
        BackendKind::Rocm => {
            use ipfs_accelerate_backend_rocm::RocmBackend;
            fused_or_not(
                RocmBackend::new(0),
                RocmBackend::unfused(0),
                precision,
                work,
            )
        }
        #[cfg(feature = "metal")]
        BackendKind::Metal => wgpu_in(kind, precision, work),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu | BackendKind::WebGpu => wgpu_in(kind, precision, work),
        other => {
            let _ = (work, precision);
            Err(Error::Core(
                ipfs_accelerate_core::Error::BackendUnavailable {
                    kind: other.to_string(),
                    reason: format!("not compiled in (enable feature `{}`)", other.feature()),
                },
            ))
        }
    }
}

/// Runs `work` on the wgpu backend as `kind` (wgpu, webgpu or metal).
#[cfg(feature = "wgpu")]
fn wgpu_in<W: WithBackend>(kind: BackendKind, precision: Precision, work: W) -> Result<W::Output> {
    use ipfs_accelerate_backend_wgpu::WgpuBackend;
    fused_or_not(
        WgpuBackend::new(kind),
        WgpuBackend::unfused(kind),
        precision,
        work,
    )
}

/// Runs `work` on `fused` when kernel fusion is on ([`kernel_fusion`]), else on `unfused`; the
/// fused attention path (`ipfs_accelerate_nn::attention::set_fused_attention`) follows the same
/// switch.
#[allow(dead_code)] // unused only in a build with no CubeCL backend
fn fused_or_not<F, U, W>(fused: F, unfused: U, precision: Precision, work: W) -> Result<W::Output>
where
    F: ipfs_accelerate_core::Backend,
    U: ipfs_accelerate_core::Backend,
    W: WithBackend,
{
    let fusion = kernel_fusion();
    ipfs_accelerate_nn::attention::set_fused_attention(fusion);
    if fusion {
        run_in(&fused, precision, work)
    } else {
        run_in(&unfused, precision, work)
    }
}

/// Checks that `hal` can run here, sets the device's precision, then runs `work` on `hal`. On a
/// device whose f32 matrix kernels round to TF32, f32 products are split into exact parts
/// (`ipfs_accelerate_nn::exact`) unless `IPFS_ACCELERATE_TF32=1`.
#[allow(dead_code)] // unused only in a build with no native backend
fn run_in<H: ipfs_accelerate_core::Backend, W: WithBackend>(
    hal: &H,
    precision: Precision,
    work: W,
) -> Result<W::Output> {
    // burn panics creating a device the machine does not have: say why instead.
    if let Availability::Unavailable(reason) = hal.probe() {
        return Err(Error::Core(
            ipfs_accelerate_core::Error::BackendUnavailable {
                kind: hal.kind().to_string(),
                reason,
            },
        ));
    }
    // bf16 on the CPU with its kernels: f32 tensors, linear weights kept as bf16 and multiplied
    // by the AVX-512 BF16 kernel (burn-flex's own bf16 tensors run generic code, slower than f32).
    if precision == Precision::BF16
        && hal.kind() == BackendKind::Cpu
        && ipfs_accelerate_nn::fast::enabled()
    {
        if hal.set_precision(Precision::F32).is_err() {
            // The device already computes in another precision: say so in bf16's terms.
            hal.set_precision(precision)?;
        }
        return ipfs_accelerate_nn::fast::with_bf16_linears(|| work.run(hal));
    }
    hal.set_precision(precision)?;
    if precision == Precision::F32 && hal.rounds_f32_products() && !tf32_allowed() {
        ipfs_accelerate_nn::exact::split_f32_products::<H::Burn>();
    }
    work.run(hal)
}

#[cfg(all(test, feature = "cpu", not(feature = "cuda"), not(feature = "wgpu")))]
mod tests {
    use super::*;

    #[test]
    fn selection_skips_what_is_not_compiled_in_with_the_reason() {
        let sel = selector()
            .select(&[BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu])
            .unwrap();
        assert_eq!(sel.device.kind, BackendKind::Cpu);
        let reasons: Vec<(BackendKind, &str)> = sel
            .skipped
            .iter()
            .map(|s| (s.kind, s.reason.as_str()))
            .collect();
        assert_eq!(
            reasons,
            vec![
                (BackendKind::Cuda, "not compiled in (enable feature `cuda`)"),
                (BackendKind::Wgpu, "not compiled in (enable feature `wgpu`)"),
            ]
        );
        let err = selector().select(&[BackendKind::Metal]).unwrap_err();
        assert!(err.to_string().contains("metal: not compiled in"), "{err}");
        assert!(selector().select(&[]).is_err());
    }

    #[test]
    fn defaults_are_the_compiled_in_backends() {
        assert_eq!(compiled_preferences(), vec![BackendKind::Cpu]);
    }
}
