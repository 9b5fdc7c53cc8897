//! Bad configurations stop the engine at start with a message naming the key.

mod common;
use common::ENGINE_BIN;
use std::process::Command;

fn run_with(config: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("engine.yaml");
    std::fs::write(&p, config).unwrap();
    let out = Command::new(ENGINE_BIN)
        .arg("--config")
        .arg(&p)
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
