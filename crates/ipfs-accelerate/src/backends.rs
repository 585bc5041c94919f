//! The backends compiled into this build, and dispatch from a run-time [`BackendKind`] to the
//! compile-time burn backend type.

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
    // one backend under both kinds: `wgpu` (native API) and `webgpu` (same adapter and kernels)
    #[cfg(feature = "wgpu")]
    v.extend([BackendKind::Wgpu, BackendKind::WebGpu].map(|kind| {
        Box::new(ipfs_accelerate_backend_wgpu::WgpuBackend::new(kind)) as Box<dyn ProbeBackend>
    }));
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

/// Probe results for every backend kind (compiled in or not), as `devices` prints them.
pub fn devices() -> Vec<(BackendKind, Availability)> {
    selector().probe_all()
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

/// Work that needs a concrete backend type: implemented once, run on whichever backend is chosen.
pub(crate) trait WithBackend {
    type Output;
    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output>;
}

/// Runs `work` on the backend `kind` in `precision`, if it is compiled in.
pub(crate) fn with_backend<W: WithBackend>(
    kind: BackendKind,
    precision: Precision,
    work: W,
) -> Result<W::Output> {
    match kind {
        #[cfg(feature = "cpu")]
        BackendKind::Cpu => run_in(&ipfs_accelerate_backend_cpu::CpuBackend, precision, work),
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => run_in(
            &ipfs_accelerate_backend_cuda::CudaBackend::default(),
            precision,
            work,
        ),
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu | BackendKind::WebGpu => run_in(
            &ipfs_accelerate_backend_wgpu::WgpuBackend::new(kind),
            precision,
            work,
        ),
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

/// Sets the device's precision, then runs `work` on `hal`.
#[allow(dead_code)] // unused only in a build with no native backend
fn run_in<H: ipfs_accelerate_core::Backend, W: WithBackend>(
    hal: &H,
    precision: Precision,
    work: W,
) -> Result<W::Output> {
    hal.set_precision(precision)?;
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
