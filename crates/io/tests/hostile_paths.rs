//! Model files from strangers: names in a checkpoint's metadata, hub ids and revisions never make
//! the loader open anything outside the model folder or the HF cache, and safetensors headers with
//! absurd offsets are typed errors (never a panic).

use std::path::Path;

use bytes::Bytes;
use ipfs_accelerate_io::{
    check_file_name, check_model_id, check_revision, resolve, IoError, ModelFiles, ResolveOptions,
    SafeTensorsFile,
};

/// A valid one-tensor safetensors image (`w`: f32 `[2]`).
fn tiny_safetensors() -> Vec<u8> {
    safetensors_with(
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
        8,
    )
}

/// A safetensors image with `header` (padded to 8 bytes) and `data_len` zero bytes of data.
fn safetensors_with(header: &str, data_len: usize) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend(std::iter::repeat_n(0u8, data_len));
    out
}

fn offline(cache: &Path) -> ResolveOptions {
    ResolveOptions {
        offline: true,
        progress: false,
        cache_dir: Some(cache.to_path_buf()),
    }
}

fn assert_unsafe(err: IoError, what: &str) {
    match &err {
        IoError::UnsafeName { .. } => assert!(err.to_string().contains(what), "{err}"),
        other => panic!("expected a refused {what}, got: {other}"),
    }
}

/// A model folder whose shard index names a file outside it: `../outside.safetensors` or an
/// absolute path. Before the check, both loaded the outside file.
#[test]
fn shard_index_cannot_name_files_outside_the_folder() {
    let root = tempfile::tempdir().unwrap();
    let outside = root.path().join("outside.safetensors");
    std::fs::write(&outside, tiny_safetensors()).unwrap();
    let model = root.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("config.json"), "{}").unwrap();
    for shard in [
        "../outside.safetensors".to_string(),
        outside.display().to_string(),
        "sub/../../outside.safetensors".to_string(),
        "./../outside.safetensors".to_string(),
    ] {
        let index = serde_json::json!({ "weight_map": { "w": shard } });
        std::fs::write(
            model.join("model.safetensors.index.json"),
            index.to_string(),
        )
        .unwrap();
        let files = ModelFiles::local(&model).unwrap();
        assert_unsafe(files.weight_files().unwrap_err(), "file name");
    }
}

/// `org/name@../../dir` used to escape the HF cache and load an arbitrary folder.
#[test]
fn revisions_cannot_leave_the_cache() {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    std::fs::create_dir_all(cache.join("models--org--name/refs")).unwrap();
    // The folder an escaping revision would reach: <cache>/models--org--name/snapshots/../../../evil
    let evil = root.path().join("evil");
    std::fs::create_dir_all(&evil).unwrap();
    std::fs::write(evil.join("config.json"), "{}").unwrap();
    for spec in [
        "org/name@../../../evil",
        "org/name@..",
        "org/name@/abs",
        "org/name@a//b",
        "org/name@main\\..\\x",
        "org/name@",
    ] {
        let err = resolve(spec, offline(&cache)).unwrap_err();
        assert_unsafe(err, "revision");
    }
    // A ref file that names a commit outside the snapshots.
    std::fs::write(cache.join("models--org--name/refs/main"), "../../../evil\n").unwrap();
    let files = resolve("org/name", offline(&cache)).unwrap();
    assert_unsafe(files.get("config.json").unwrap_err(), "revision");
}

/// A snapshot entry that links outside the repository's cache folder is refused.
#[cfg(unix)]
#[test]
fn cached_links_must_stay_in_the_repository() {
    let root = tempfile::tempdir().unwrap();
    let cache = root.path().join("cache");
    let repo = cache.join("models--org--name");
    let snap = repo.join("snapshots/abc123");
    std::fs::create_dir_all(&snap).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::write(repo.join("refs/main"), "abc123").unwrap();
    // Inside: as the hub client lays it out (a link into blobs/).
    std::fs::write(repo.join("blobs/cfg"), "{}").unwrap();
    std::os::unix::fs::symlink("../../blobs/cfg", snap.join("config.json")).unwrap();
    // Outside: a link to a file elsewhere.
    let secret = root.path().join("secret.txt");
    std::fs::write(&secret, "secret").unwrap();
    std::os::unix::fs::symlink(&secret, snap.join("tokenizer.json")).unwrap();
    let files = resolve("org/name", offline(&cache)).unwrap();
    assert!(files.get("config.json").unwrap().is_file());
    assert_unsafe(files.get("tokenizer.json").unwrap_err(), "cached file");
}

#[test]
fn model_ids_follow_the_hub_rules() {
    let cache = tempfile::tempdir().unwrap();
    for bad in [
        "org/name/extra",
        "org//name",
        "-org/name",
        ".hidden/name",
        "org/na--me",
        "org/na..me",
        "org/name with space",
        "org/näme",
        &"x".repeat(97),
    ] {
        assert!(check_model_id(bad).is_err(), "{bad} accepted");
        // A spec that is not an existing path is a hub id and is checked before any lookup.
        if !Path::new(bad).exists() {
            assert_unsafe(resolve(bad, offline(cache.path())).unwrap_err(), "model id");
        }
    }
    for good in [
        "gpt2",
        "org/name",
        "sentence-transformers/all-MiniLM-L6-v2",
        "a.b_c/d-e.1",
    ] {
        check_model_id(good).unwrap();
    }
}

#[test]
fn file_and_revision_names() {
    for bad in [
        "",
        "/etc/passwd",
        "../x",
        "a/../x",
        "a/./x",
        "a//x",
        "a/",
        "..",
        ".",
        "a\\..\\x",
        "C:x",
        "a\0b",
        "a\nb",
    ] {
        assert!(check_file_name("m", bad).is_err(), "{bad:?} accepted");
    }
    for good in [
        "model.safetensors",
        "onnx/model.onnx",
        "1_Pooling/config.json",
        ".gitattributes",
    ] {
        check_file_name("m", good).unwrap();
    }
    for good in [
        "main",
        "v1.0",
        "refs/pr/1",
        "0123456789abcdef0123456789abcdef01234567",
    ] {
        check_revision("m", good).unwrap();
    }
    for bad in [
        "",
        "..",
        "a/../b",
        "/main",
        "main/",
        ".git",
        "a b",
        &"r".repeat(257),
    ] {
        assert!(check_revision("m", bad).is_err(), "{bad:?} accepted");
    }
}

/// Offsets near 2^64 overflowed inside the safetensors crate (a panic in checked builds).
#[test]
fn safetensors_offsets_past_the_data_are_typed_errors() {
    let huge = u64::MAX - 3;
    for header in [
        format!(r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":[0,{huge}]}}}}"#),
        format!(r#"{{"w":{{"dtype":"F32","shape":[2],"data_offsets":[{huge},{huge}]}}}}"#),
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,16]}}"#.to_string(),
        r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[-1,8]}}"#.to_string(),
        r#"{"w":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,8]}}"#.to_string(),
    ] {
        let bytes = Bytes::from(safetensors_with(&header, 8));
        match SafeTensorsFile::from_bytes("hostile", bytes) {
            Err(IoError::MalformedSafetensors { .. }) => {}
            Err(other) => panic!("{header}: unexpected error {other}"),
            Ok(_) => panic!("{header}: accepted"),
        }
    }
}
