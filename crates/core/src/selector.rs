//! Backend selection: the first usable backend of a preference list, with reasons for the rest.

use crate::{Availability, BackendKind, DeviceInfo, Error, ProbeBackend};

/// A backend that was passed over, and why.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SkippedBackend {
    /// The backend.
    pub kind: BackendKind,
    /// Why it was not used ("not compiled in ...", "unavailable: ...", or a load error).
    pub reason: String,
}

/// The result of selection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Selection {
    /// The chosen device.
    pub device: DeviceInfo,
    /// Preferences before it that were skipped, in order.
    pub skipped: Vec<SkippedBackend>,
}

/// Picks backends from the ones compiled into this build.
pub struct Selector {
    compiled: Vec<Box<dyn ProbeBackend>>,
}

impl Selector {
    /// A selector over the compiled-in backends.
    pub fn new(compiled: Vec<Box<dyn ProbeBackend>>) -> Self {
        Selector { compiled }
    }

    /// Probes one backend (not compiled in → [`Availability::NotCompiled`]).
    pub fn probe(&self, kind: BackendKind) -> Availability {
        self.compiled
            .iter()
            .find(|b| b.kind() == kind)
            .map(|b| b.probe())
            .unwrap_or(Availability::NotCompiled)
    }

    /// Probe results for every backend kind, compiled in or not.
    pub fn probe_all(&self) -> Vec<(BackendKind, Availability)> {
        BackendKind::all()
            .into_iter()
            .map(|k| (k, self.probe(k)))
            .collect()
    }

    /// Every usable backend of `preferences`, in order, each with the reasons the ones before it were
    /// skipped. Callers that fail to load a model on the first can fall through to the next.
    pub fn candidates(
        &self,
        preferences: &[BackendKind],
    ) -> (Vec<DeviceInfo>, Vec<SkippedBackend>) {
        let mut usable = Vec::new();
        let mut skipped = Vec::new();
        for &kind in preferences {
            match self.probe(kind) {
                Availability::Available(info) => usable.push(info),
                other => {
                    let reason = other.reason(kind).unwrap_or_default();
                    tracing::info!(backend = %kind, %reason, "backend skipped");
                    skipped.push(SkippedBackend { kind, reason });
                }
            }
        }
        (usable, skipped)
    }

    /// The first usable backend of `preferences`, with the reasons earlier ones were skipped.
    pub fn select(&self, preferences: &[BackendKind]) -> Result<Selection, Error> {
        let mut skipped = Vec::new();
        for &kind in preferences {
            match self.probe(kind) {
                Availability::Available(device) => return Ok(Selection { device, skipped }),
                other => skipped.push(SkippedBackend {
                    kind,
                    reason: other.reason(kind).unwrap_or_default(),
                }),
            }
        }
        Err(Error::NoBackend(describe(&skipped)))
    }
}

/// `cuda: not compiled in (...); wgpu: unavailable: ...`
pub(crate) fn describe(skipped: &[SkippedBackend]) -> String {
    if skipped.is_empty() {
        return "the preference list is empty".into();
    }
    skipped
        .iter()
        .map(|s| format!("{}: {}", s.kind, s.reason))
        .collect::<Vec<_>>()
        .join("; ")
}
