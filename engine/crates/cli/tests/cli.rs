//! Runs the `peregrine` binary as scripts do and checks the error contract:
//! one line on stderr, exit 1 for failures, exit 2 for usage errors.

use std::net::TcpListener;
use std::process::{Command, Output};

fn peregrine(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(args)
        .env_remove("PEREGRINE_MGMT")
        .env_remove("PEREGRINE_TLS_DIR")
        .env_remove("PEREGRINE_INSECURE")
        .output()
        .expect("run peregrine")
}

/// An address with nothing listening: bind an ephemeral port, then free it.
fn dead_addr() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    drop(l);
    addr
}

fn stderr_lines(o: &Output) -> Vec<String> {
    String::from_utf8_lossy(&o.stderr)
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn unreachable_service_is_one_line_and_exit_1() {
    let addr = dead_addr();
    for cmd in [
        &["system", "query"][..],
        &["pool", "list"],
        &["pool", "create", "tank", "--size", "1G"],
        &["obj", "ls", "tank", "demo", "SX:1.2"],
    ] {
        let mut args = vec!["--mgmt", addr.as_str(), "--timeout", "5", "--insecure"];
        args.extend_from_slice(cmd);
        let o = peregrine(&args);
        assert_eq!(o.status.code(), Some(1), "{cmd:?}: {o:?}");
        let lines = stderr_lines(&o);
        assert_eq!(lines.len(), 1, "{cmd:?}: want one line, got {lines:?}");
        assert_eq!(
            lines[0],
            format!("peregrine: cannot reach management service at {addr}: connection refused")
        );
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn env_var_names_the_service() {
    let addr = dead_addr();
    let o = Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .args(["system", "query"])
        .env("PEREGRINE_MGMT", &addr)
        .env("PEREGRINE_INSECURE", "1")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr_lines(&o)[0].contains(&addr), "{o:?}");
}

#[test]
fn bad_flags_exit_2() {
    // Unknown flag, missing required size, conflicting size forms: clap's usage errors.
    for args in [
        &["pool", "list", "--bogus"][..],
        &["pool", "create", "tank"],
        &[
            "pool",
            "create",
            "tank",
            "--size",
            "1G",
            "--scm-size",
            "1G",
            "--nvme-size",
            "2G",
        ],
        &["cont", "snap", "destroy", "p", "c"],
        &["frobnicate"],
    ] {
        let o = peregrine(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {o:?}");
    }
}

#[test]
fn bad_values_name_the_flag_in_one_line() {
    let o = peregrine(&["pool", "create", "tank", "--size", "12XB"]);
    assert_eq!(o.status.code(), Some(2));
    let lines = stderr_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("peregrine: --size \"12XB\": unknown unit"),
        "{}",
        lines[0]
    );

    let o = peregrine(&["obj", "get", "p", "c", "QQ:1.2", "d", "a"]);
    assert_eq!(o.status.code(), Some(2));
    let lines = stderr_lines(&o);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("unknown object class") && lines[0].contains("RP_2G1"),
        "{}",
        lines[0]
    );

    let o = peregrine(&["pool", "set-prop", "tank", "novalue"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr_lines(&o)[0].contains("KEY=VALUE"));
}

#[test]
fn help_is_not_an_error() {
    let o = peregrine(&["--help"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains("pool"));
}

#[test]
fn certs_writes_a_ca_and_leaves_with_private_keys() {
    use std::os::unix::fs::PermissionsExt;
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().to_str().unwrap();
    let o = peregrine(&[
        "certs", "--system", "tank", "--out", dir, "--ranks", "2", "--admin", "--client", "fuse",
    ]);
    assert!(o.status.success(), "{o:?}");
    let listed = String::from_utf8_lossy(&o.stdout);
    for sub in ["ca", "engine-0", "engine-1", "admin", "client-fuse"] {
        assert!(
            listed.contains(&format!("{dir}/{sub}")),
            "{sub} not listed: {listed}"
        );
    }
    for f in [
        "ca/ca.key",
        "engine-1/tls.key",
        "admin/tls.key",
        "client-fuse/tls.key",
    ] {
        let mode = std::fs::metadata(out.path().join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    for f in ["engine-0/ca.crt", "engine-0/tls.crt", "client-fuse/tls.crt"] {
        assert!(out.path().join(f).is_file(), "{f}");
    }
    let o = peregrine(&["certs", "--system", "bad name", "--out", dir]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr_lines(&o)[0].contains("--system"), "{o:?}");
}
