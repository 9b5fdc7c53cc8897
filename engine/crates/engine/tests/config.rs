//! Bad configurations stop the engine at start with a message naming the key.

mod common;
use common::ENGINE_BIN;
use std::process::Command;

fn run_with(config: &str) -> (i32, String) {
    run_with_flags(config, &[])
}

fn run_with_flags(config: &str, flags: &[&str]) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("engine.yaml");
    std::fs::write(&p, config).unwrap();
    let out = Command::new(ENGINE_BIN)
        .arg("--config")
        .arg(&p)
        .args(flags)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const GOOD: &str = "rank: 0\ncontrol_port: 1\ndata_port: 2\ntargets: 1\nscm: {class: ram, size: 64MiB}\nbdev: {class: file, path: /tmp/x.img, size: 128MiB}\nallow_insecure: true\n";

#[test]
fn bad_configs_name_the_key() {
    let cases = [
        (GOOD.replace("targets: 1", "targetz: 1"), "targetz"),
        (GOOD.replace("targets: 1", "targets: 1000"), "targets"),
        (GOOD.replace("size: 128MiB", "size: lots"), "lots"),
        (GOOD.replace("size: 128MiB", "size: 1MiB"), "bdev.size"),
        (GOOD.replace("data_port: 2", "data_port: 1"), "data_port"),
        (GOOD.replace("rank: 0\n", ""), "rank"),
        (format!("{GOOD}flush_interval_ms: 0\n"), "flush_interval_ms"),
        ("{{{".to_string(), "config"),
    ];
    for (text, key) in cases {
        let (code, err) = run_with(&text);
        assert_eq!(code, 1, "config {text:?}: stderr {err}");
        assert!(err.contains(key), "error {err:?} should name {key:?}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let out = Command::new(ENGINE_BIN)
        .arg("--config")
        .arg("/nonexistent/engine.yaml")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/engine.yaml"));
}

/// A configuration engines share (as the operator's ConfigMap): each gives
/// its own values as flags, checked as the keys they stand for.
#[test]
fn per_engine_flags_are_checked_as_the_keys() {
    let shared = GOOD
        .replace("rank: 0\n", "")
        .replace("path: /tmp/x.img, ", "");
    let cases: [(&[&str], &str); 4] = [
        (&["--bdev-path", "/tmp/x.img"], "--rank"),
        (&["--rank", "0"], "--bdev-path"),
        (
            &[
                "--rank",
                "0",
                "--bdev-path",
                "/tmp/x.img",
                "--dns-name",
                "a..b",
            ],
            "dns_name",
        ),
        (
            &[
                "--rank",
                "0",
                "--bdev-path",
                "/tmp/x.img",
                "--fault-domain",
                "",
            ],
            "fault_domain",
        ),
    ];
    for (flags, key) in cases {
        let (code, err) = run_with_flags(&shared, flags);
        assert_eq!(code, 1, "{flags:?}: stderr {err}");
        assert!(err.contains(key), "{flags:?}: {err:?} should name {key:?}");
    }
    // A flag of the wrong type: refused by clap, naming it.
    let (code, err) = run_with_flags(GOOD, &["--listen-addr", "pod-0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--listen-addr"), "{err}");
}
