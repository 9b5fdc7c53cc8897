//! `peregrine-agent` against a real TLS cluster (docs/access-control.md):
//! programs of other users, without a certificate, connect through it, and
//! the ACLs see the uid the kernel gives the agent's socket, not what the
//! caller says; the engines then enforce the handles they got. The agent
//! forwards only the calls a client certificate may make, refuses frames
//! past its bound, and keeps serving.

use peregrine::agent::{self, AgentSource};
use peregrine::mgmt::ControlSource;
use peregrine::{ObjectClass, ObjectId, TransportKind};
use peregrine_proto::mgmt::*;
use peregrine_testcluster::{build_c_program, props, Cluster, ClusterSpec};
use prost::Message;
use std::io::{BufRead, BufReader};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// uid and gid of "nobody" on Debian (the test grants it by name).
const NOBODY: u32 = 65534;
/// A uid no passwd file names (its user is "12345").
const STRANGER: u32 = 12345;

struct Agent {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The agent with the cluster's client certificate, on a socket in a
/// directory every user may enter.
fn start_agent(c: &Cluster) -> Agent {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("agent.sock");
    Agent {
        child: spawn_agent(c, &socket),
        socket,
        _dir: dir,
    }
}

/// An agent process serving `socket`, once it listens.
fn spawn_agent(c: &Cluster, socket: &Path) -> Child {
    spawn_agent_with(c, socket, &c.client_tls_dir().expect("a TLS cluster"))
}

/// [`spawn_agent`] with the certificate directory `tls`.
fn spawn_agent_with(c: &Cluster, socket: &Path, tls: &Path) -> Child {
    let _ = std::fs::remove_file(socket);
    let child = Command::new(env!("CARGO_BIN_EXE_peregrine-agent"))
        .arg("--socket")
        .arg(socket)
        .args(["--mgmt", &c.mgmt_addr()])
        .arg("--tls-dir")
        .arg(tls)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the agent did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

impl Agent {
    /// kill -9 (its socket file stays, as after a crash).
    fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// A new agent on the same socket, after [`Agent::kill9`].
    fn start_again(&mut self, c: &Cluster) {
        self.child = spawn_agent(c, &self.socket);
    }
}

/// Pool "pool" (everyone may connect), container "ro" (nobody reads) and
/// "rw" (group nogroup writes), both owned by ann; d/a of object 7 holds
/// "admin" in "ro".
fn cluster() -> Cluster {
    let c = Cluster::start(ClusterSpec::default());
    c.format();
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: "pool".into(),
        total_size: 64 << 20,
        props: props(&[("acl", "A::OWNER@:rwa,A::EVERYONE@:r")]),
        ..Default::default()
    }))
    .unwrap();
    for (label, acl) in [
        ("ro", "A::OWNER@:rwa,A::nobody@:r"),
        ("rw", "A::OWNER@:rwa,A:G:nogroup@:rw"),
    ] {
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "pool".into(),
            label: label.into(),
            oclass: "S1".into(),
            props: props(&[("acl", acl), ("owner", "ann@")]),
            ..Default::default()
        }))
        .unwrap();
    }
    c.client()
        .pool_connect("pool")
        .unwrap()
        .cont_open("ro")
        .unwrap()
        .object(ObjectId::new(ObjectClass::S1, 0, 7))
        .unwrap()
        .update_single(b"d", b"a", b"admin")
        .unwrap();
    c
}

/// Run the program as `uid` (its own group: nobody's is nogroup, 65534).
fn run_as(uid: u32, prog: &(PathBuf, PathBuf), agent: &Agent, cont: &str, expect: &str) {
    let out = Command::new(&prog.0)
        .args(["pool", cont, expect])
        .env_clear()
        .env("LD_LIBRARY_PATH", &prog.1)
        .env(agent::ENV_SOCKET, &agent.socket)
        .env("PEREGRINE_TRANSPORT", "tcp")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "uid {uid}, {cont}, {expect}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn other_users_connect_through_the_agent_as_the_kernel_names_them() {
    let c = cluster();
    let agent = start_agent(&c);
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let prog = build_c_program("agent_user", bin.path());

    // nobody reads "ro" and is refused its write there (a read-only handle,
    // enforced by the engine); as a member of nogroup it writes "rw".
    run_as(NOBODY, &prog, &agent, "ro", "read");
    run_as(NOBODY, &prog, &agent, "rw", "write");
    // A uid the ACLs do not name opens neither.
    run_as(STRANGER, &prog, &agent, "ro", "none");
    run_as(STRANGER, &prog, &agent, "rw", "none");

    // This process (root) may claim to be nobody: the agent names it root,
    // whom "ro" does not list.
    let src = AgentSource::connect(&agent.socket).unwrap();
    let claim = ContQueryReq {
        pool: "pool".into(),
        id: "ro".into(),
        cred: Some(Credential {
            uid: NOBODY,
            gid: NOBODY,
            user: "nobody".into(),
            groups: vec!["nogroup".into()],
        }),
        ..Default::default()
    };
    let e = src
        .call("cont_query", claim.encode_to_vec())
        .expect_err("root is not in the ACL, whatever it claims");
    assert_eq!(e.code, -libc::EACCES, "{e}");
    assert!(
        e.msg.contains("root"),
        "the refusal names the real user: {e}"
    );

    // Through the library: the pool connects (EVERYONE@ reads it).
    let root = agent::connect(&agent.socket, TransportKind::Tcp, Default::default()).unwrap();
    let pool = root.pool_connect("pool").unwrap();
    assert_eq!(
        pool.cont_open("ro").err().map(|e| e.code),
        Some(-libc::EACCES)
    );

    // Calls that need an administrator are not forwarded.
    let e = src
        .call(
            "pool_destroy",
            PoolDestroyReq {
                id: "pool".into(),
                ..Default::default()
            }
            .encode_to_vec(),
        )
        .expect_err("not forwarded");
    assert_eq!(e.code, -libc::EACCES, "{e}");
    assert!(e.msg.contains("administrator"), "{e}");

    // A frame past the bound is refused by name, and the connection closed;
    // the agent serves the next caller.
    let mut s = UnixStream::connect(&agent.socket).unwrap();
    s.write_all(&(agent::MAX_REQUEST as u32 + 1).to_le_bytes())
        .unwrap();
    let e = agent::read_reply(&mut s).expect_err("refused");
    assert_eq!(e.code, -libc::EPROTO, "{e}");
    assert!(e.msg.contains("at most"), "{e}");
    let mut rest = Vec::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(s.read_to_end(&mut rest).unwrap(), 0, "then closed");
    run_as(NOBODY, &prog, &agent, "ro", "read");
}

#[test]
fn a_client_keeps_working_across_an_agent_restart() {
    let c = cluster();
    let mut agent = start_agent(&c);
    let bin = tempfile::tempdir().unwrap();
    std::fs::set_permissions(bin.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (exe, lib_dir) = build_c_program("agent_user", bin.path());

    // nobody writes d/c through the agent, then waits with its client open.
    let mut prog = Command::new(&exe)
        .args(["pool", "rw", "reopen"])
        .env_clear()
        .env("LD_LIBRARY_PATH", &lib_dir)
        .env(agent::ENV_SOCKET, &agent.socket)
        .env("PEREGRINE_TRANSPORT", "tcp")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(prog.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n", "the program wrote d/c: {}", {
        let out = prog.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    });

    // While the agent is down a caller is told so at once, not left hanging.
    agent.kill9();
    let e = AgentSource::connect(&agent.socket)
        .err()
        .expect("no agent listens");
    assert!(
        [-libc::ECONNREFUSED, -libc::ENOENT].contains(&e.code),
        "{e}"
    );

    // The agent comes back; the program's next pool connect and container
    // open go through the new one, as nobody again, and read d/c back.
    agent.start_again(&c);
    prog.stdin.as_mut().unwrap().write_all(b"go\n").unwrap();
    let out = prog.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "after the agent's restart: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // In-process too: a client made before a restart connects after it.
    let root = agent::connect(&agent.socket, TransportKind::Tcp, Default::default()).unwrap();
    root.pool_connect("pool").unwrap();
    agent.kill9();
    agent.start_again(&c);
    root.pool_connect("pool")
        .expect("the library dials the restarted agent");
}

/// `peregrine --agent SOCKET obj ...` as `uid`, with no certificate and
/// nothing of this process's environment.
fn cli_as(uid: u32, agent: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_peregrine"))
        .arg("--agent")
        .arg(agent)
        .args(args)
        .env_clear()
        .env("PEREGRINE_TRANSPORT", "tcp")
        .uid(uid)
        .gid(uid)
        .output()
        .unwrap()
}

/// The CLI as nobody through the agent at `socket` reads "admin" from "ro"
/// within 30 s (the agent may still be connecting).
fn nobody_reads_through(socket: &Path, why: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let out = loop {
        let out = cli_as(NOBODY, socket, &GET_RO);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        out.status.success(),
        "{why}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"admin");
}

/// `obj get` of what [`cluster`] put in "ro".
const GET_RO: [&str; 7] = ["obj", "get", "pool", "ro", "S1:0.7", "d", "a"];

#[test]
fn the_agent_waits_for_the_service_and_the_cli_goes_through_it() {
    let mut c = cluster();
    // The agent starts while the management service is down (a DaemonSet
    // scheduled before its ServerSet): it serves at once, keeps trying the
    // service, and tells callers meanwhile why it cannot act for them.
    c.engines[0].stop();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = Agent {
        child: spawn_agent(&c, &socket),
        socket: socket.clone(),
        _dir: dir,
    };
    let out = cli_as(NOBODY, &socket, &GET_RO);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has not reached the management service"),
        "the error says what the agent waits for: {err}"
    );

    c.restart(0);
    nobody_reads_through(&socket, "the agent reaches the service once it is back");

    // nobody, the ACL's reader of "ro", may not write it; it writes "rw" as a member of nogroup and reads it back.
    let out = cli_as(
        NOBODY,
        &socket,
        &[
            "obj", "put", "pool", "ro", "S1:0.7", "d", "a", "--value", "x",
        ],
    );
    assert!(!out.status.success(), "a reader's write is refused");
    let put = [
        "obj",
        "put",
        "pool",
        "rw",
        "S1:0.8",
        "d",
        "a",
        "--value",
        "by nobody",
    ];
    let out = cli_as(NOBODY, &socket, &put);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = cli_as(
        NOBODY,
        &socket,
        &["obj", "get", "pool", "rw", "S1:0.8", "d", "a"],
    );
    assert_eq!(
        out.stdout,
        b"by nobody",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A uid the ACLs do not name opens neither, whatever its environment says.
    let out = cli_as(STRANGER, &socket, &GET_RO);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("12345"), "the refusal names the caller: {err}");
    agent.kill9();
}

#[test]
fn the_agent_takes_its_certificate_files_as_they_are_replaced() {
    let c = cluster();
    // A certificate directory whose certificate is damaged, as during a
    // Secret's update: the agent cannot connect, and says why.
    let tls = tempfile::tempdir().unwrap();
    let client = c.client_tls_dir().expect("a TLS cluster");
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        std::fs::copy(client.join(f), tls.path().join(f)).unwrap();
    }
    std::fs::write(tls.path().join("tls.crt"), b"not a certificate").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let socket = dir.path().join("agent.sock");
    let mut agent = Agent {
        child: spawn_agent_with(&c, &socket, tls.path()),
        socket: socket.clone(),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = loop {
        let out = cli_as(NOBODY, &socket, &GET_RO);
        if !out.stderr.is_empty() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has not reached the management service"),
        "{err}"
    );

    // The good files come back: the agent connects with them, unrestarted.
    std::fs::copy(client.join("tls.crt"), tls.path().join("tls.crt")).unwrap();
    nobody_reads_through(&socket, "the agent connects with the good files");
    agent.kill9();
}
