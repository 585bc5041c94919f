//! Tests of the shared-tensor registry: reference counting and freeing (measured by the registry's
//! accounting), zero-copy views, cross-model publish/acquire, residency moves on burn-flex,
//! LRU memory optimisation, typed errors and concurrent acquire/release.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;

use burn::tensor::{Float, Int, Tensor};
use burn_flex::Flex;
use bytes::Bytes;
use half::f16;
use ipfs_accelerate_core::shared::{BurnDeviceCopy, DeviceCopy, Residency, SharedError};
use ipfs_accelerate_core::{BackendKind, DType, Error, HostTensor, SharedTensors};

fn ramp(shape: Vec<usize>) -> HostTensor {
    let n: usize = shape.iter().product();
    let values: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
    HostTensor::from_f32(shape, &values).unwrap()
}

const CPU0: Residency = Residency::Device {
    kind: BackendKind::Cpu,
    ordinal: 0,
};
const CPU1: Residency = Residency::Device {
    kind: BackendKind::Cpu,
    ordinal: 1,
};

#[test]
fn refcounts_drop_to_zero_and_storage_is_freed() {
    let reg = SharedTensors::new();
    let bert = reg.publish("bert", "emb", ramp(vec![6, 4])).unwrap();
    assert_eq!(reg.bytes_total(), 96);
    let clip_a = reg.acquire("clip", "emb").unwrap();
    let clip_b = clip_a.clone();
    let info = reg.info("emb").unwrap();
    assert_eq!(info.refcount, 3);
    assert_eq!(info.holders.get("bert"), Some(&1));
    assert_eq!(info.holders.get("clip"), Some(&2));
    assert_eq!(info.owner, "bert");
    assert_eq!(info.bytes, 96);

    drop(bert);
    // The publisher leaving does not free it: clip still holds it.
    assert_eq!(clip_a.refcount(), 2);
    assert_eq!(reg.bytes_total(), 96);
    assert_eq!(reg.bytes_by_owner().get("bert"), Some(&96));
    drop(clip_a);
    assert_eq!(clip_b.refcount(), 1);
    drop(clip_b);

    assert_eq!(reg.bytes_total(), 0);
    assert!(reg.bytes_by_owner().is_empty());
    assert!(reg.bytes_by_device().is_empty());
    assert!(reg.is_empty());
    assert_eq!(
        reg.acquire("clip", "emb").unwrap_err(),
        SharedError::NotFound { name: "emb".into() }
    );
    // The name is free again, and a stale generation cannot be confused with the new entry.
    let again = reg.publish("t5", "emb", ramp(vec![2])).unwrap();
    assert_eq!(again.refcount(), 1);
    assert_eq!(reg.bytes_total(), 8);
}

#[test]
fn pinned_entries_outlive_their_holders_until_unpinned_or_reclaimed() {
    let reg = SharedTensors::new();
    let h = reg.publish("bert", "pooler", ramp(vec![4])).unwrap();
    reg.pin("pooler").unwrap();
    drop(h);
    let info = reg.info("pooler").unwrap();
    assert_eq!((info.refcount, info.pinned, info.bytes), (0, true, 16));

    // Still acquirable while idle.
    let h = reg.acquire("clip", "pooler").unwrap();
    drop(h);
    assert!(reg.unpin("pooler").unwrap());
    assert_eq!(reg.bytes_total(), 0);

    // Unpinning a held entry does not free it; the last drop does.
    let h = reg.publish("bert", "pooler", ramp(vec![4])).unwrap();
    reg.pin("pooler").unwrap();
    assert!(!reg.unpin("pooler").unwrap());
    drop(h);
    assert!(reg.is_empty());

    // optimize_memory reclaims idle pinned entries.
    let h = reg.publish("bert", "idle", ramp(vec![8])).unwrap();
    let keep = reg.publish("bert", "busy", ramp(vec![2])).unwrap();
    reg.pin("idle").unwrap();
    reg.pin("busy").unwrap();
    drop(h);
    let report = reg.optimize_memory(u64::MAX);
    assert_eq!(report.freed.len(), 1);
    assert_eq!(report.freed[0].name, "idle");
    assert_eq!(report.bytes_freed, 32);
    assert!(report.moved.is_empty());
    assert_eq!(reg.bytes_total(), 8);
    assert!(reg.contains("busy"));
    drop(keep);
    assert!(reg.contains("busy"), "pinned");
    assert_eq!(
        reg.unpin("missing").unwrap_err(),
        SharedError::NotFound {
            name: "missing".into()
        }
    );
}

#[test]
fn views_share_storage_without_copying() {
    let reg = SharedTensors::new();
    let h = reg.publish("bert", "w", ramp(vec![4, 3, 2])).unwrap();
    let host = h.host().unwrap();
    let base = host.bytes().as_ptr();
    let values = host.to_f32_vec();
    let before = reg.bytes_total();

    // Leading-dim narrow: contiguous, a byte slice of the same storage.
    let rows = h.narrow(0, 1, 2).unwrap();
    assert!(rows.is_contiguous());
    assert_eq!(rows.shape(), &[2, 3, 2]);
    assert_eq!(rows.storage_ptr(), base);
    assert_eq!(rows.as_ptr(), base.wrapping_add(6 * 4));
    let t = rows.as_host_tensor().unwrap();
    assert_eq!(t.bytes().as_ptr(), base.wrapping_add(6 * 4));
    assert_eq!(t.to_f32_vec(), values[6..18].to_vec());

    // Inner-dim narrow: strided, still the same storage; values gathered only on request.
    let cols = h.narrow(1, 1, 2).unwrap();
    assert!(!cols.is_contiguous());
    assert!(cols.as_host_tensor().is_none());
    assert_eq!(cols.storage_ptr(), base);
    assert_eq!(cols.as_ptr(), base.wrapping_add(2 * 4));
    assert_eq!(cols.strides(), &[6, 2, 1]);
    let expected: Vec<f32> = (0..4)
        .flat_map(|i| (1..3).flat_map(move |j| (0..2).map(move |k| i * 6 + j * 2 + k)))
        .map(|idx| values[idx])
        .collect();
    assert_eq!(cols.to_f32_vec(), expected);

    // Chained narrows and a slice agree, and a narrow of a narrow stays in the same storage.
    let a = h.slice(&[1..3, 0..2, 1..2]).unwrap();
    let b = rows.narrow(1, 0, 2).unwrap().narrow(2, 1, 1).unwrap();
    assert_eq!(a.to_f32_vec(), b.to_f32_vec());
    assert_eq!(
        a.to_f32_vec(),
        vec![values[7], values[9], values[13], values[15]]
    );
    assert_eq!(a.storage_ptr(), base);

    // A narrow of the last dim that leaves one column of a [n, 1]-like run is contiguous.
    let col = h.narrow(0, 2, 1).unwrap().narrow(1, 1, 1).unwrap();
    assert!(col.is_contiguous());
    assert_eq!(
        col.as_host_tensor().unwrap().bytes().as_ptr(),
        base.wrapping_add(14 * 4)
    );

    // No bytes were added to the registry by any of this.
    assert_eq!(reg.bytes_total(), before);
    assert_eq!(reg.len(), 1);

    // Views are holders: the entry lives as long as a view does.
    let refs = h.refcount();
    drop((host, h, rows, cols, b, col));
    assert_eq!(refs, 6);
    assert_eq!(reg.info("w").unwrap().refcount, 1);
    assert_eq!(
        a.to_f32_vec(),
        vec![values[7], values[9], values[13], values[15]]
    );
    drop(a);
    assert!(reg.is_empty());
}

#[test]
fn bad_views_are_typed_errors() {
    let reg = SharedTensors::new();
    let h = reg.publish("bert", "w", ramp(vec![4, 3])).unwrap();
    for err in [
        h.narrow(2, 0, 1).unwrap_err(),
        h.narrow(0, 3, 2).unwrap_err(),
        h.narrow(1, usize::MAX, 2).unwrap_err(),
        h.slice(&[0..1, 0..1, 0..1]).unwrap_err(),
        h.slice(&[0..5, 0..1]).unwrap_err(),
    ] {
        assert!(
            matches!(&err, SharedError::BadView { name, .. } if name == "w"),
            "{err}"
        );
        assert!(matches!(Error::from(err), Error::InvalidInput(_)));
    }
    // Empty views are fine.
    let empty = h.narrow(0, 4, 0).unwrap();
    assert_eq!(empty.numel(), 0);
    assert_eq!(empty.to_host_tensor().shape(), &[0, 3]);
}

#[test]
fn publish_and_acquire_across_two_models() {
    let reg = SharedTensors::new();
    let models = reg.clone(); // the same registry, as another pipeline would see it
    let bert = reg
        .publish("bert", "encoder.word_embeddings", ramp(vec![10, 4]))
        .unwrap();
    let clip = models.acquire("clip", "encoder.word_embeddings").unwrap();
    assert_eq!(clip.owner(), "bert");
    assert_eq!(clip.holder(), "clip");
    assert_eq!(clip.shape(), &[10, 4]);
    assert_eq!(clip.dtype(), DType::F32);
    // Both models see one storage.
    assert_eq!(
        bert.host().unwrap().bytes().as_ptr(),
        clip.host().unwrap().bytes().as_ptr()
    );
    assert_eq!(reg.bytes_total(), 160);

    // Duplicate publish is typed and names the first owner.
    assert_eq!(
        models
            .publish("clip", "encoder.word_embeddings", ramp(vec![10, 4]))
            .unwrap_err(),
        SharedError::AlreadyPublished {
            name: "encoder.word_embeddings".into(),
            owner: "bert".into()
        }
    );
    // publish_or_get: same shape returns the existing storage (the offered copy is dropped).
    let shared = models
        .publish_or_get("llava", "encoder.word_embeddings", ramp(vec![10, 4]))
        .unwrap();
    assert_eq!(
        shared.host().unwrap().bytes().as_ptr(),
        bert.host().unwrap().bytes().as_ptr()
    );
    assert_eq!(reg.bytes_total(), 160);
    assert_eq!(reg.info("encoder.word_embeddings").unwrap().refcount, 3);
    // ... another shape is a conflict.
    let err = models
        .publish_or_get("llava", "encoder.word_embeddings", ramp(vec![4, 10]))
        .unwrap_err();
    assert!(
        matches!(err, SharedError::Conflict { ref existing_shape, .. } if existing_shape == &[10, 4])
    );

    // get_or_publish_with loads once.
    let loads = AtomicUsize::new(0);
    let load = || -> Result<HostTensor, Error> {
        loads.fetch_add(1, Ordering::SeqCst);
        Ok(ramp(vec![3]))
    };
    let first = reg.get_or_publish_with("bert", "head", load).unwrap();
    let second = models.get_or_publish_with("clip", "head", load).unwrap();
    assert_eq!(loads.load(Ordering::SeqCst), 1);
    assert_eq!(second.owner(), "bert");
    assert_eq!(first.refcount(), 2);
    // A loader error passes through unchanged.
    let err = reg
        .get_or_publish_with("bert", "broken", || {
            Err::<HostTensor, Error>(Error::InvalidInput("no file".into()))
        })
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(ref m) if m == "no file"));
    assert!(!reg.contains("broken"));

    let by_owner = reg.bytes_by_owner();
    assert_eq!(by_owner.get("bert"), Some(&(160 + 12)));
    assert_eq!(by_owner.get("clip"), None);
    drop((bert, clip, shared, first, second));
    assert_eq!(reg.bytes_total(), 0);
}

#[test]
fn typed_errors_convert_into_core_errors() {
    let reg = SharedTensors::new();
    let err = reg.acquire("clip", "text_embedding").unwrap_err();
    assert_eq!(
        err,
        SharedError::NotFound {
            name: "text_embedding".into()
        }
    );
    assert!(err.to_string().contains("text_embedding"));
    match Error::from(err) {
        Error::MissingTensor { name, .. } => assert_eq!(name, "text_embedding"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        reg.publish("", "x", ramp(vec![1])).unwrap_err(),
        SharedError::EmptyName { what: "owner" }
    );
    assert_eq!(
        reg.publish("bert", "", ramp(vec![1])).unwrap_err(),
        SharedError::EmptyName {
            what: "tensor name"
        }
    );
    assert_eq!(
        reg.acquire("", "x").unwrap_err(),
        SharedError::EmptyName { what: "holder" }
    );
    // `?` into the crate error.
    fn uses_core_result(reg: &SharedTensors) -> ipfs_accelerate_core::Result<usize> {
        Ok(reg.acquire("bert", "nothing")?.refcount())
    }
    assert!(matches!(
        uses_core_result(&reg),
        Err(Error::MissingTensor { .. })
    ));
}

#[test]
fn residency_moves_update_accounting_on_burn_flex() {
    let reg = SharedTensors::new();
    let device = Default::default();
    let h = reg.publish("bert", "w", ramp(vec![3, 4])).unwrap();
    let values = h.host().unwrap().to_f32_vec();
    assert_eq!(h.residency(), Residency::Host);

    h.to_device::<Flex, 2, Float>(&device, BackendKind::Cpu, 0)
        .unwrap();
    assert_eq!(h.residency(), CPU0);
    let by_device = reg.bytes_by_device();
    assert_eq!(by_device.get(&CPU0), Some(&48));
    assert_eq!(by_device.get(&Residency::Host), None);
    let t: Tensor<Flex, 2> = h.device_tensor::<Flex, 2, Float>().unwrap();
    assert_eq!(t.dims(), [3, 4]);
    assert_eq!(t.into_data().to_vec::<f32>().unwrap(), values);

    // While on the device, host access and views are typed errors.
    assert_eq!(
        h.host().unwrap_err(),
        SharedError::NotOnHost {
            name: "w".into(),
            residency: CPU0
        }
    );
    assert!(matches!(
        h.narrow(0, 0, 1),
        Err(SharedError::NotOnHost { .. })
    ));
    assert!(matches!(
        h.device_tensor::<Flex, 3, Float>(),
        Err(SharedError::DeviceTypeMismatch { .. })
    ));
    assert!(matches!(
        h.device_tensor::<Flex, 2, Int>(),
        Err(SharedError::DeviceTypeMismatch { .. })
    ));

    // Moving to another ordinal reads back and re-uploads.
    reg.to_device::<Flex, 2, Float>("w", &device, BackendKind::Cpu, 1)
        .unwrap();
    let by_device = reg.bytes_by_device();
    assert_eq!(by_device.get(&CPU1), Some(&48));
    assert_eq!(by_device.get(&CPU0), None);
    // Same place and type: nothing happens.
    reg.to_device::<Flex, 2, Float>("w", &device, BackendKind::Cpu, 1)
        .unwrap();
    assert_eq!(reg.bytes_total(), 48);

    h.to_host().unwrap();
    assert_eq!(h.residency(), Residency::Host);
    assert_eq!(h.host().unwrap().to_f32_vec(), values);
    assert_eq!(reg.bytes_by_device().get(&Residency::Host), Some(&48));
    assert!(matches!(
        h.device_tensor::<Flex, 2, Float>(),
        Err(SharedError::NotOnDevice { .. })
    ));
    // to_host on the host is a no-op.
    h.to_host().unwrap();

    // Rank and kind are checked before uploading.
    assert_eq!(
        h.to_device::<Flex, 3, Float>(&device, BackendKind::Cpu, 0)
            .unwrap_err(),
        SharedError::RankMismatch {
            name: "w".into(),
            shape: vec![3, 4],
            rank: 3
        }
    );
    assert!(matches!(
        h.to_device::<Flex, 2, Int>(&device, BackendKind::Cpu, 0),
        Err(SharedError::KindMismatch {
            kind: "Int",
            dtype: DType::F32,
            ..
        })
    ));
    assert_eq!(h.residency(), Residency::Host);
    assert_eq!(
        reg.to_host("nope").unwrap_err(),
        SharedError::NotFound {
            name: "nope".into()
        }
    );

    // Freed while on a device: the device copy leaves the accounting too.
    h.to_device::<Flex, 2, Float>(&device, BackendKind::Cpu, 0)
        .unwrap();
    drop(h);
    assert_eq!(reg.bytes_total(), 0);
    assert!(reg.bytes_by_device().is_empty());
}

#[test]
fn dtypes_round_trip_through_the_device() {
    let reg = SharedTensors::new();
    let device = Default::default();
    // f16 on the host: the device holds the backend's float type, the read-back is f16 again.
    let halves: Vec<u8> = [1.5f32, -2.25, 0.125, 1024.0]
        .iter()
        .flat_map(|&v| f16::from_f32(v).to_le_bytes())
        .collect();
    let ht = HostTensor::from_bytes("h", vec![2, 2], DType::F16, Bytes::from(halves)).unwrap();
    let h = reg.publish("m", "half", ht.clone()).unwrap();
    h.to_device::<Flex, 2, Float>(&device, BackendKind::Cpu, 0)
        .unwrap();
    let t = h.device_tensor::<Flex, 2, Float>().unwrap();
    let device_bytes = (t.dtype().size() * 4) as u64;
    assert_eq!(reg.bytes_by_device().get(&CPU0), Some(&device_bytes));
    h.to_host().unwrap();
    assert_eq!(h.host().unwrap(), ht);
    assert_eq!(reg.bytes_total(), 8);

    // Integers go up as Int tensors.
    let ids = HostTensor::from_i64(vec![5], &[3, -1, 7, 0, 42]).unwrap();
    let i = reg.publish("m", "ids", ids.clone()).unwrap();
    i.to_device::<Flex, 1, Int>(&device, BackendKind::Cpu, 0)
        .unwrap();
    let t = i.device_tensor::<Flex, 1, Int>().unwrap();
    assert_eq!(
        t.into_data().iter::<i64>().collect::<Vec<_>>(),
        vec![3, -1, 7, 0, 42]
    );
    assert!(matches!(
        i.to_device::<Flex, 1, Float>(&device, BackendKind::Cpu, 0),
        Err(SharedError::KindMismatch { .. })
    ));
    i.to_host().unwrap();
    assert_eq!(i.host().unwrap(), ids);
}

#[test]
fn custom_uploads_go_through_to_device_with() {
    let reg = SharedTensors::new();
    let device: burn::tensor::Device<Flex> = Default::default();
    let h = reg.publish("m", "w", ramp(vec![2, 3])).unwrap();
    let uploads = AtomicUsize::new(0);
    let upload = |host: &HostTensor| -> ipfs_accelerate_core::Result<Arc<dyn DeviceCopy>> {
        uploads.fetch_add(1, Ordering::SeqCst);
        Ok(Arc::new(BurnDeviceCopy::<Flex, 2, Float>::upload(
            "w", host, &device,
        )?))
    };
    reg.to_device_with("w", BackendKind::Wgpu, 0, upload)
        .unwrap();
    reg.to_device_with("w", BackendKind::Wgpu, 0, upload)
        .unwrap();
    assert_eq!(uploads.load(Ordering::SeqCst), 1, "second call is a no-op");
    let wgpu0 = Residency::device(BackendKind::Wgpu, 0);
    assert_eq!(h.residency(), wgpu0);
    assert_eq!(h.device_copy().unwrap().bytes(), 24);
    // The generic accessor finds it too, since the copy is a BurnDeviceCopy.
    assert_eq!(h.device_tensor::<Flex, 2, Float>().unwrap().dims(), [2, 3]);

    // A failing upload is a typed transfer error and leaves the entry on the host.
    h.to_host().unwrap();
    let err = reg
        .to_device_with("w", BackendKind::Cuda, 0, |_| {
            Err(Error::BackendUnavailable {
                kind: "cuda".into(),
                reason: "no driver".into(),
            })
        })
        .unwrap_err();
    assert!(
        matches!(&err, SharedError::Transfer { name, reason } if name == "w" && reason.contains("no driver"))
    );
    assert!(matches!(Error::from(err), Error::Compute(_)));
    assert_eq!(h.residency(), Residency::Host);
}

#[test]
fn optimize_memory_moves_least_recently_used_first_and_respects_the_budget() {
    let reg = SharedTensors::new();
    let device = Default::default();
    let names = ["a", "b", "c", "d"];
    let handles: Vec<_> = names
        .iter()
        .map(|n| reg.publish("bert", n, ramp(vec![4, 4])).unwrap()) // 64 bytes each
        .collect();
    for n in &names[..3] {
        reg.to_device::<Flex, 2, Float>(n, &device, BackendKind::Cpu, 0)
            .unwrap();
    }
    reg.to_device::<Flex, 2, Float>("d", &device, BackendKind::Cpu, 1)
        .unwrap();
    // Use order now: a, b, c (uploads), d; then touch a and c again -> LRU on cpu:0 is b, a, c.
    handles[0].device_tensor::<Flex, 2, Float>().unwrap();
    handles[2].device_tensor::<Flex, 2, Float>().unwrap();
    let b_used = reg.info("b").unwrap().last_used;
    assert!(b_used < reg.info("a").unwrap().last_used);
    assert!(reg.info("a").unwrap().last_used < reg.info("c").unwrap().last_used);
    assert_eq!(reg.bytes_by_device().get(&CPU0), Some(&192));

    // 192 on cpu:0 and 64 on cpu:1 with a budget of 128: only b moves.
    let report = reg.optimize_memory(128);
    let moved: Vec<_> = report.moved.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(moved, ["b"]);
    assert_eq!(report.moved[0].from, CPU0);
    assert_eq!(report.moved[0].last_used, b_used);
    assert_eq!(report.bytes_moved, 64);
    assert!(report.within_budget());
    assert!(report.freed.is_empty() && report.failed.is_empty());
    assert_eq!(report.device_bytes.get(&CPU0), Some(&128));
    assert_eq!(report.device_bytes.get(&CPU1), Some(&64));
    assert_eq!(reg.bytes_by_device(), {
        let mut m = std::collections::BTreeMap::new();
        m.insert(Residency::Host, 64);
        m.insert(CPU0, 128);
        m.insert(CPU1, 64);
        m
    });
    assert_eq!(handles[1].residency(), Residency::Host);
    assert_eq!(
        handles[1].host().unwrap().to_f32_vec(),
        ramp(vec![4, 4]).to_f32_vec()
    );
    // Moving does not change the total or the refcounts.
    assert_eq!(reg.bytes_total(), 256);
    assert_eq!(handles[0].refcount(), 1);

    // Within budget: nothing moves.
    assert!(reg.optimize_memory(128).moved.is_empty());

    // Budget 100: a leaves cpu:0 (older than c); cpu:1 is within budget.
    let report = reg.optimize_memory(100);
    let moved: Vec<_> = report.moved.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(moved, ["a"]);
    assert!(report.within_budget());
    assert_eq!(report.device_bytes.get(&CPU0), Some(&64));
    assert_eq!(report.device_bytes.get(&CPU1), Some(&64));

    // Budget 0 with an idle pinned entry: freed first, then everything is on the host.
    reg.pin("c").unwrap();
    let mut handles = handles;
    let c = handles.remove(2);
    drop(c);
    let report = reg.optimize_memory(0);
    assert_eq!(report.freed.len(), 1);
    assert_eq!(report.freed[0].name, "c");
    assert_eq!(report.freed[0].residency, CPU0);
    assert_eq!(report.freed[0].bytes, 64);
    let moved: Vec<_> = report.moved.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(moved, ["d"]);
    assert_eq!(report.moved[0].from, CPU1);
    assert!(report.device_bytes.is_empty());
    assert!(report.within_budget());
    assert_eq!(reg.bytes_total(), 192);
    drop(handles);
    assert_eq!(reg.bytes_total(), 0);
}

#[test]
fn concurrent_acquire_and_release_from_eight_threads_leaves_exact_counts() {
    let reg = SharedTensors::new();
    let publisher = reg.publish("bert", "emb", ramp(vec![16, 8])).unwrap();
    reg.pin("emb").unwrap();
    let threads = 8;
    let rounds: usize = 300;
    let barrier = Arc::new(Barrier::new(threads + 1));
    let loads = Arc::new(AtomicUsize::new(0));
    let mut joins = Vec::new();
    for t in 0..threads {
        let reg = reg.clone();
        let barrier = barrier.clone();
        let loads = loads.clone();
        joins.push(thread::spawn(move || {
            let holder = format!("model{t}");
            barrier.wait();
            let mut kept = Vec::new();
            for r in 0..rounds {
                let h = reg.acquire(&holder, "emb").unwrap();
                assert!(h.refcount() >= 1);
                let c = h.clone();
                if r % 7 == 0 {
                    kept.push(c.clone());
                }
                // Views work whenever the tensor is on the host.
                match h.narrow(0, t, 2) {
                    Ok(v) => assert_eq!(v.shape(), &[2, 8]),
                    Err(e) => assert!(matches!(e, SharedError::NotOnHost { .. }), "{e}"),
                }
                drop(h);
                drop(c);
                // Racing lazy publishers of another entry: one load wins per lifetime.
                let s = reg
                    .get_or_publish_with(&holder, "scratch", || {
                        loads.fetch_add(1, Ordering::SeqCst);
                        Ok::<_, SharedError>(ramp(vec![4]))
                    })
                    .unwrap();
                drop(s);
                if r % 50 == 0 {
                    reg.optimize_memory(0);
                }
            }
            let n = kept.len();
            drop(kept);
            n
        }));
    }
    // Meanwhile the main thread moves the tensor between host and device.
    let device = Default::default();
    barrier.wait();
    for _ in 0..20 {
        match reg.to_device::<Flex, 2, Float>("emb", &device, BackendKind::Cpu, 0) {
            Ok(()) | Err(SharedError::Transfer { .. }) => {}
            Err(e) => panic!("{e}"),
        }
        match reg.to_host("emb") {
            Ok(()) | Err(SharedError::Transfer { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    for j in joins {
        assert_eq!(j.join().unwrap(), rounds.div_ceil(7));
    }
    reg.to_host("emb").unwrap();
    assert_eq!(publisher.refcount(), 1);
    drop(publisher);
    let info = reg.info("emb").unwrap();
    assert_eq!(info.refcount, 0, "{info:?}");
    assert!(info.holders.is_empty());
    assert!(!reg.contains("scratch"));
    assert!(loads.load(Ordering::SeqCst) >= 1);
    assert_eq!(reg.bytes_total(), 16 * 8 * 4);
    assert!(reg.unpin("emb").unwrap());
    assert_eq!(reg.bytes_total(), 0);
    assert!(reg.is_empty());
}
