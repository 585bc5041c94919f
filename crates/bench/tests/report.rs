//! Rendering tests of the benchmark report. The measurements below are hand-made test input
//! (arbitrary but plausible values), not benchmark results: they only exercise the rendering.

use std::path::Path;

use ipfs_accelerate_bench::chromium;
use ipfs_accelerate_bench::report;
use ipfs_accelerate_bench::{LatencyStats, Measurement, RunInfo, Status};

const ROCM_REASON: &str = "no ROCm device: /dev/kfd missing <hip> & \"driver\"";
const FAILED_REASON: &str = "out of memory: <alloc> of 4 GiB & retry failed";

fn run(id: &str, started: &str, host: &str) -> RunInfo {
    RunInfo {
        run_id: id.into(),
        started_at: started.into(),
        git_commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
        host: host.into(),
        os: "linux 6.1 x86_64".into(),
        cpu_model: "Test CPU @ 3.0GHz".into(),
        cores: 16,
        gpu: Some("Test GPU".into()),
        driver: Some("555.1".into()),
        command: "cargo xtask bench --family bert".into(),
        build_profile: Some("release".into()),
        opt_level: Some("3".into()),
    }
}

/// A measured point with mean latency `mean_ms` (the other statistics spread around it).
#[allow(clippy::too_many_arguments)]
fn measured(
    run_id: &str,
    family: &str,
    model: &str,
    backend: &str,
    batch: u32,
    seq: u32,
    kind: &str,
    mean_ms: f64,
    device_bytes: Option<u64>,
) -> Measurement {
    let timings: Vec<f64> = [0.9, 0.98, 1.0, 1.02, 1.1]
        .iter()
        .map(|f| f * mean_ms)
        .collect();
    let tokens = kind == "tokens";
    Measurement {
        run_id: run_id.into(),
        family: family.into(),
        model: model.into(),
        backend: backend.into(),
        dtype: "f32".into(),
        batch,
        seq,
        shape_kind: kind.into(),
        warmup: 2,
        iters_asked: timings.len() as u32,
        iters_done: timings.len() as u32,
        status: Status::Ok,
        reason: None,
        load_ms: Some(120.0),
        latency: Some(LatencyStats {
            mean_ms,
            p50_ms: mean_ms,
            p90_ms: mean_ms * 1.1,
            p99_ms: mean_ms * 1.1,
            min_ms: mean_ms * 0.9,
            max_ms: mean_ms * 1.1,
            stddev_ms: mean_ms * 0.07,
        }),
        items_per_s: Some(f64::from(batch) * 1000.0 / mean_ms),
        tokens_per_s: tokens.then(|| f64::from(batch * seq) * 1000.0 / mean_ms),
        host_rss_peak_bytes: Some((200 + u64::from(batch) * u64::from(seq) / 4) << 20),
        device_memory_bytes: device_bytes,
        flops: Some(1e9 * f64::from(batch)),
        achieved_flops_per_s: Some(1e12 * f64::from(batch) / mean_ms),
        peak_flops_pct: None,
        timings_ms: timings,
        ..Default::default()
    }
}

fn not_measured(backend: &str, batch: u32, seq: u32, status: Status, reason: &str) -> Measurement {
    Measurement {
        run_id: "r2".into(),
        family: "bert".into(),
        model: "minilm-l6".into(),
        backend: backend.into(),
        dtype: "f32".into(),
        batch,
        seq,
        shape_kind: "tokens".into(),
        warmup: 2,
        iters_asked: 5,
        status,
        reason: Some(reason.into()),
        ..Default::default()
    }
}

/// bert/minilm-l6 on cpu, cuda, wgpu (one shape) and an unavailable rocm; vit/vit-base on cpu
/// only, without memory figures.
fn fixture() -> (Vec<RunInfo>, Vec<Measurement>) {
    let runs = vec![
        run("r1", "2026-01-01T10:00:00Z", "old-host"),
        run("r2", "2026-02-01T10:00:00Z", "bench<box>&1"),
    ];
    let gib = Some(1u64 << 30);
    let bert = |backend, batch, seq, mean, dev| {
        measured(
            "r2",
            "bert",
            "minilm-l6",
            backend,
            batch,
            seq,
            "tokens",
            mean,
            dev,
        )
    };
    let mut ms = vec![
        // An older run of the same point: superseded by r2's 20 ms.
        measured(
            "r1",
            "bert",
            "minilm-l6",
            "cpu",
            1,
            32,
            "tokens",
            99.0,
            None,
        ),
        bert("cpu", 1, 32, 20.0, None),
        bert("cpu", 8, 32, 80.0, None),
        bert("cpu", 1, 128, 40.0, None),
        not_measured("cpu", 8, 128, Status::Failed, FAILED_REASON),
        bert("cuda", 1, 32, 10.0, gib),
        bert("cuda", 8, 32, 16.0, gib),
        bert("cuda", 1, 128, 12.5, gib),
        bert("cuda", 8, 128, 25.0, gib),
        bert("wgpu", 8, 128, 50.0, None),
    ];
    for (b, s) in [(1, 32), (8, 32), (1, 128), (8, 128)] {
        ms.push(not_measured("rocm", b, s, Status::Unavailable, ROCM_REASON));
    }
    for (b, mean) in [(1, 30.0), (4, 100.0)] {
        let mut m = measured("r2", "vit", "vit-base", "cpu", b, 224, "pixels", mean, None);
        m.host_rss_peak_bytes = None;
        ms.push(m);
    }
    (runs, ms)
}

/// Text of the cells of the speed-up table row whose first cell is `shape`.
fn speedup_row(html: &str, shape: &str) -> Vec<String> {
    let marker = format!("<tr><td>{shape}</td>");
    let start = html
        .find("<table class=\"speedups\">")
        .and_then(|t| html[t..].find(&marker).map(|i| t + i))
        .unwrap_or_else(|| panic!("no speed-up row for {shape}"));
    let row = &html[start..start + html[start..].find("</tr>").expect("row end")];
    row.split("<td")
        .skip(1)
        .map(|cell| {
            let cell = &cell[cell.find('>').expect("cell tag") + 1..];
            let mut text = String::new();
            let mut in_tag = false;
            for c in cell.chars() {
                match c {
                    '<' => in_tag = true,
                    '>' => in_tag = false,
                    c if !in_tag => text.push(c),
                    _ => {}
                }
            }
            text
        })
        .collect()
}

fn svgs(html: &str) -> Vec<&str> {
    html.match_indices("<svg")
        .map(|(i, _)| &html[i..i + html[i..].find("</svg>").expect("svg end")])
        .collect()
}

#[test]
fn page_has_one_svg_per_plot_and_only_inline_content() {
    let (runs, ms) = fixture();
    let html = report::render_html(&runs, &ms);
    // bert: latency, throughput, memory; vit: latency, throughput (no memory measured).
    assert_eq!(html.matches("<svg").count(), 5, "{html}");
    assert_eq!(svgs(&html).len(), 5);
    assert!(html.contains("latency vs batch"));
    assert!(html.contains("No memory use was measured."));
    assert!(!html.contains("<script"));
    assert!(!html.contains("src="));
    assert!(!html.contains("href=\"http"));
    assert!(!html.contains("url("));
    assert!(html.contains("bench&lt;box&gt;&amp;1"));
    assert!(!html.contains("bench<box>"));
    assert!(html.contains("1 measurement(s) of points that a later run measured again"));
    // vit sizes are image sides; bert throughput is in tokens/s, vit in items/s.
    assert!(html.contains("224px"));
    assert!(html.contains("tokens/s"));
}

#[test]
fn unavailable_and_failed_points_are_listed_escaped_never_plotted() {
    let (runs, ms) = fixture();
    let html = report::render_html(&runs, &ms);
    assert!(html.contains("no ROCm device: /dev/kfd missing &lt;hip&gt; &amp; &quot;driver&quot;"));
    assert!(html.contains("out of memory: &lt;alloc&gt; of 4 GiB &amp; retry failed"));
    assert!(!html.contains("<hip>"));
    assert!(!html.contains("<alloc>"));
    for svg in svgs(&html) {
        assert!(!svg.contains("rocm"), "an unavailable backend was plotted");
    }
    let table_start = html.find("<table class=\"speedups\">").expect("speed-ups");
    let table = &html[table_start..table_start + html[table_start..].find("</table>").unwrap()];
    assert!(!table.contains("rocm"));
    // The superseded 99 ms of the older run is not shown anywhere.
    assert!(!html.contains(">99.0<"));
}

#[test]
fn speedups_are_against_cpu_or_the_slowest_backend() {
    let (runs, ms) = fixture();
    let html = report::render_html(&runs, &ms);
    // Columns: shape, baseline, cpu, cuda, wgpu.
    assert_eq!(
        speedup_row(&html, "b1 s32"),
        [
            "b1 s32",
            "cpu (20.0 ms)",
            "1.00× (20.0 ms)",
            "2.00× (10.0 ms)",
            "—"
        ]
    );
    assert_eq!(
        speedup_row(&html, "b8 s32"),
        [
            "b8 s32",
            "cpu (80.0 ms)",
            "1.00× (80.0 ms)",
            "5.00× (16.0 ms)",
            "—"
        ]
    );
    assert_eq!(
        speedup_row(&html, "b1 s128"),
        [
            "b1 s128",
            "cpu (40.0 ms)",
            "1.00× (40.0 ms)",
            "3.20× (12.5 ms)",
            "—"
        ]
    );
    // cpu failed at b8 s128: the baseline is the slowest measured backend.
    assert_eq!(
        speedup_row(&html, "b8 s128"),
        [
            "b8 s128",
            "wgpu (50.0 ms)",
            "—",
            "2.00× (25.0 ms)",
            "1.00× (50.0 ms)"
        ]
    );
}

#[test]
fn empty_input_says_there_are_no_measurements() {
    let html = report::render_html(&[], &[]);
    assert!(html.contains("no measurements"));
    assert!(!html.contains("<svg"));
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn compare_backends_ranks_fastest_first() {
    let (_, ms) = fixture();
    let text = report::compare_backends(&ms, "bert", Some("minilm-l6"));
    let section = |shape: &str| -> Vec<String> {
        let start = text
            .find(&format!("shape {shape}\n"))
            .expect("shape section");
        text[start..]
            .lines()
            .skip(2)
            .take_while(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let rows = section("f32 b1 s32");
    assert_eq!(rows.len(), 2, "{text}");
    let fields: Vec<Vec<&str>> = rows
        .iter()
        .map(|r| r.split_whitespace().collect())
        .collect();
    assert_eq!(fields[0][..2], ["1", "cuda"]);
    assert_eq!(fields[0].last(), Some(&"1.00×"));
    assert_eq!(fields[1][..2], ["2", "cpu"]);
    assert_eq!(fields[1].last(), Some(&"2.00×"));

    let rows = section("f32 b8 s128");
    let order: Vec<&str> = rows
        .iter()
        .map(|r| r.split_whitespace().nth(1).unwrap())
        .collect();
    assert_eq!(order, ["cuda", "wgpu"]);
    assert!(rows[1].ends_with("2.00×"));

    assert!(
        text.contains(&format!("rocm           unavailable: {ROCM_REASON}")),
        "{text}"
    );
    assert!(text.contains(&format!("cpu            failed: {FAILED_REASON}")));
    // rocm is listed once, not once per shape.
    assert_eq!(text.matches("rocm").count(), 1);

    assert!(report::compare_backends(&ms, "llama", None).contains("no measurements"));
    let vit = report::compare_backends(&ms, "vit", None);
    assert!(
        vit.contains("vit / vit-base") && vit.contains("224px"),
        "{vit}"
    );
}

#[test]
fn report_renders_in_headless_chromium() {
    let browser = match chromium::Chromium::find() {
        Ok(b) => b,
        Err(err) => {
            if std::env::var("IPFS_ACCELERATE_REQUIRE_CHROMIUM").as_deref() == Ok("1") {
                panic!("IPFS_ACCELERATE_REQUIRE_CHROMIUM=1 but: {err}");
            }
            eprintln!("skipping the Chromium render check: {err}");
            return;
        }
    };
    let (runs, ms) = fixture();
    let html = report::render_html(&runs, &ms);
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("report page.html");
    let png = dir.path().join("report.png");
    std::fs::write(&page, &html).expect("write page");
    browser
        .screenshot(&page, &png, 1280, 1600)
        .expect("screenshot");
    if let Some(keep) = std::env::var_os("IPFS_ACCELERATE_KEEP_REPORT") {
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep).expect("keep dir");
        std::fs::copy(&page, keep.join("report.html")).expect("keep html");
        std::fs::copy(&png, keep.join("report.png")).expect("keep png");
    }

    let stats = chromium::analyze_screenshot(&png).expect("analyze");
    assert_eq!((stats.width, stats.height), (1280, 1600));
    assert_eq!(stats.background, [255, 255, 255]);
    assert!(!stats.is_blank(), "{stats:?}");
    let colours = report::backend_colours(&ms);
    for backend in ["cpu", "cuda"] {
        let (_, rgb) = colours.iter().find(|(b, _)| b == backend).expect("colour");
        let n = chromium::count_colour_near(&png, *rgb, 24).expect("pixels");
        assert!(
            n > 100,
            "{backend}'s plot colour {rgb:?} shows on {n} pixels"
        );
    }

    // The check can fail: a page of text only is blank by this criterion.
    let text_page = dir.path().join("text.html");
    std::fs::write(&text_page, report::render_html(&runs, &[])).expect("write");
    let text_png = dir.path().join("text.png");
    browser
        .screenshot(&text_page, &text_png, 800, 600)
        .expect("screenshot");
    assert!(chromium::screenshot_is_blank(&text_png).expect("analyze"));
}

#[test]
fn missing_chromium_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("page.html");
    let png = dir.path().join("page.png");
    let err = chromium::Chromium::at("/nonexistent/chromium")
        .screenshot(&page, &png, 10, 10)
        .unwrap_err();
    assert!(matches!(err, chromium::ChromiumError::Io { .. }), "{err}");
    assert!(err.to_string().contains("page.html"), "{err}");
    std::fs::write(&page, "<p>x</p>").expect("write");
    let err = chromium::Chromium::at("/nonexistent/chromium")
        .screenshot(&page, &png, 10, 10)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("cannot start Chromium /nonexistent/chromium"),
        "{err}"
    );
    let err = chromium::Chromium::at("/nonexistent/chromium")
        .screenshot(Path::new("x.html"), Path::new("x.png"), 0, 10)
        .unwrap_err();
    assert!(matches!(err, chromium::ChromiumError::BadWindowSize { .. }));
    let msg = chromium::ChromiumError::NotFound {
        searched: "PATH".into(),
    }
    .to_string();
    assert!(msg.contains("IPFS_ACCELERATE_CHROMIUM") && msg.contains("apt-get install chromium"));
}

#[cfg(unix)]
#[test]
fn browser_timeouts_failures_and_missing_screenshots_are_typed_errors() {
    use std::os::unix::fs::PermissionsExt;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().expect("temp dir");
    let page = dir.path().join("page.html");
    std::fs::write(&page, "<p>x</p>").expect("write");
    let png = dir.path().join("page.png");
    let script = |name: &str, body: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("script");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        chromium::Chromium::at(path).with_timeout(Duration::from_secs(1))
    };

    let started = Instant::now();
    let err = script("hangs", "echo starting >&2\nsleep 30")
        .screenshot(&page, &png, 100, 100)
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "not killed in time"
    );
    assert!(
        matches!(&err, chromium::ChromiumError::Timeout { seconds: 1, stderr } if stderr.contains("starting")),
        "{err}"
    );

    let err = script("fails", "echo broken >&2\nexit 3")
        .screenshot(&page, &png, 100, 100)
        .unwrap_err();
    assert!(
        matches!(&err, chromium::ChromiumError::Failed { stderr, .. } if stderr.contains("broken")),
        "{err}"
    );

    let err = script("silent", "exit 0")
        .screenshot(&page, &png, 100, 100)
        .unwrap_err();
    assert!(
        matches!(err, chromium::ChromiumError::NoScreenshot { .. }),
        "{err}"
    );

    // An image that is not a PNG is a decode error, not a panic.
    std::fs::write(&png, b"not an image").expect("write");
    let err = chromium::analyze_screenshot(&png).unwrap_err();
    assert!(
        matches!(err, chromium::ChromiumError::Image { .. }),
        "{err}"
    );
}

#[test]
fn peers_get_a_ratio_table_and_unoptimized_runs_are_flagged() {
    let mut runs = vec![run("fast", "2026-03-01T10:00:00Z", "h")];
    let mut slow = run("slow", "2026-03-02T10:00:00Z", "h");
    slow.build_profile = Some("debug".into());
    slow.opt_level = Some("1".into());
    runs.push(slow);
    let ours = measured(
        "fast",
        "bert",
        "minilm-l6",
        "cpu",
        8,
        128,
        "tokens",
        100.0,
        None,
    );
    let torch = Measurement {
        engine: "torch".into(),
        engine_version: Some("2.15.0".into()),
        ..measured(
            "fast",
            "bert",
            "minilm-l6",
            "cpu",
            8,
            128,
            "tokens",
            150.0,
            None,
        )
    };
    let ort_int8 = Measurement {
        engine: "onnxruntime".into(),
        dtype: "int8".into(),
        status: Status::Unavailable,
        reason: Some("python package missing (onnxruntime)".into()),
        latency: None,
        timings_ms: Vec::new(),
        iters_done: 0,
        ..measured(
            "fast",
            "bert",
            "minilm-l6",
            "cpu",
            8,
            128,
            "tokens",
            1.0,
            None,
        )
    };
    let unopt = measured(
        "slow",
        "bert",
        "minilm-l6",
        "cpu",
        1,
        128,
        "tokens",
        300.0,
        None,
    );
    let html = report::render_html(&runs, &[ours, torch, ort_int8, unopt]);
    assert!(html.contains("Ours vs peers"), "no ratio table");
    assert!(html.contains("<b>1.50×</b> (vs ours f32)"), "no ratio");
    assert!(html.contains("torch 2.15.0"));
    assert!(html.contains("unavailable: python package missing (onnxruntime)"));
    // The peer is its own series, and the unoptimised run's points are named so.
    assert!(html.contains("cpu · torch"));
    assert!(html.contains("cpu · opt-level 1 unoptimized"));
    assert!(html.contains("debug, opt-level 1 — UNOPTIMIZED"));
    // compare-backends ranks ours only.
    let ranking = report::compare_backends(
        &[
            measured("fast", "bert", "m", "cpu", 8, 128, "tokens", 100.0, None),
            Measurement {
                engine: "torch".into(),
                ..measured("fast", "bert", "m", "cpu", 8, 128, "tokens", 50.0, None)
            },
        ],
        "bert",
        None,
    );
    assert!(!ranking.contains("50.0"), "{ranking}");
}

#[test]
fn generation_points_get_ttft_and_decode_plots_and_ratios() {
    let runs = vec![run("gen", "2026-03-01T10:00:00Z", "h")];
    let gen = |engine: &str, kind: &str, mean_ms: f64, ttft: f64, rate: f64| Measurement {
        engine: engine.into(),
        dtype: "Q4_1".into(),
        new_tokens: Some(128),
        ttft_ms: Some(ttft),
        decode_tokens_per_s: Some(rate),
        ..measured("gen", "llama", "m.gguf", "cpu", 1, 128, kind, mean_ms, None)
    };
    let rows = [
        gen("ipfs-accelerate", "prefill", 200.0, 200.0, 220.0),
        gen("ipfs-accelerate", "decode", 4.5, 200.0, 220.0),
        gen("llama.cpp", "prefill", 250.0, 250.0, 70.0),
        gen("llama.cpp", "decode", 15.0, 250.0, 70.0),
    ];
    let html = report::render_html(&runs, &rows);
    assert!(html.contains("<h3>Generation</h3>"), "no generation plots");
    assert!(html.contains("time to first token"));
    // Prefill and decode are compared separately: 250 / 200 and 15 / 4.5.
    assert!(
        html.contains("<b>1.25×</b> (vs ours Q4_1)"),
        "no prefill ratio"
    );
    assert!(
        html.contains("<b>3.33×</b> (vs ours Q4_1)"),
        "no decode ratio"
    );
    assert!(html.contains("prompt 128 (decode)"));
}
