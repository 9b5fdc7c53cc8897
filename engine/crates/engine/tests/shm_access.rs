//! Who may use the shared-memory data plane, and when the engine may read a
//! client's memory (issue 20, point 3): the socket's mode, group and allowed
//! uids; direct reads only of the process that connected (its pidfd, taken
//! at accept) while it keeps the credentials it connected with; a process
//! that changed since its hello (an exec keeps the pid) refused; and client
//! memory whose page faults never resolve stalls only its own connection,
//! never the target, which serves its other clients throughout.
//!
//! Some clients are child processes: this test binary run again in a
//! helper mode (the ignored test `helper`, driven by `PEREGRINE_SHM_HELPER`).

mod common;
mod shmraw;
use common::*;
use peregrine::{Client, ObjectClass, ObjectId, TransportKind};
use peregrine_proto::shm::{self as wire, Hello, Mapping, RemotePart, REGION_LEN};
use shmraw::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const HELPER: &str = "PEREGRINE_SHM_HELPER";
const NOBODY: u32 = 65534;

fn spec() -> ClusterSpec {
    ClusterSpec {
        engines: 1,
        targets: 2,
        device_mib: 512,
        scm_mib: 256,
    }
}

/// This test binary as a child process running `helper` in `mode`, with
/// `fd3` (if any) as its descriptor 3.
fn helper_cmd(mode: &str, sock: &Path, fd3: Option<&UnixStream>) -> Command {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "helper",
        "--ignored",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(HELPER, mode)
    .env("PEREGRINE_SHM_SOCK", sock)
    .stdout(Stdio::piped())
    .stderr(Stdio::inherit());
    if let Some(s) = fd3 {
        let fd = s.as_raw_fd();
        // SAFETY: dup2 and fcntl only, between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if fd == 3 {
                    libc::fcntl(3, libc::F_SETFD, 0);
                } else if libc::dup2(fd, 3) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd
}

/// The `KEY=value` lines a helper printed.
fn helper_output(out: &[u8], key: &str) -> Option<String> {
    let pat = format!("{key}=");
    String::from_utf8_lossy(out)
        .lines()
        .find_map(|l| l.find(&pat).map(|i| l[i + pat.len()..].trim().to_string()))
}

/// A hello for target 0 whose probe is `nonce` (in this process).
fn probe_hello(nonce: &u64) -> Hello {
    let mut h = Hello::standard(REGION_LEN, 0);
    h.probe = nonce as *const u64 as u64;
    h.nonce = *nonce;
    h
}

/// Send a hello with a probe on `s`; the ack's flags, or None if refused.
fn helper_handshake(s: &UnixStream) -> Option<u64> {
    let nonce = Box::new(0x5eed_0000_0000_0001u64 ^ std::process::id() as u64);
    let hello = probe_hello(&nonce);
    let fd = wire::memfd_sealed("helper", hello.total).unwrap();
    wire::send_with_fds(s.as_raw_fd(), &hello.encode(), &[fd.as_raw_fd()]).ok()?;
    let mut ack = [0u8; wire::ACK_LEN];
    match wire::recv_with_fds(s.as_raw_fd(), &mut ack) {
        Ok((n, _)) if n == wire::ACK_LEN => Some(wire::check_ack(&ack).unwrap().1),
        _ => None,
    }
}

#[test]
#[ignore = "a client process for the tests of this file (PEREGRINE_SHM_HELPER)"]
fn helper() {
    let Ok(mode) = std::env::var(HELPER) else {
        return;
    };
    let sock = PathBuf::from(std::env::var("PEREGRINE_SHM_SOCK").unwrap());
    match mode.as_str() {
        // Connect and say hello as whoever this process runs as.
        "as-is" => match UnixStream::connect(&sock) {
            Err(e) => println!("CONNECT=err {}", e.raw_os_error().unwrap_or(0)),
            Ok(s) => {
                println!("CONNECT=ok");
                match helper_handshake(&s) {
                    Some(f) => println!("ACK_FLAGS={f}"),
                    None => println!("ACK_FLAGS=refused"),
                }
            }
        },
        // Connect as root, then become nobody before the hello.
        "setuid" => {
            let s = UnixStream::connect(&sock).unwrap();
            // SAFETY: dropping privileges of this whole process.
            unsafe {
                assert_eq!(libc::setgroups(0, std::ptr::null()), 0);
                assert_eq!(libc::setresgid(NOBODY, NOBODY, NOBODY), 0);
                assert_eq!(libc::setresuid(NOBODY, NOBODY, NOBODY), 0);
            }
            match helper_handshake(&s) {
                Some(f) => println!("ACK_FLAGS={f}"),
                None => println!("ACK_FLAGS=refused"),
            }
        }
        // Connect and hand the connection to the parent (fd 3), then exit.
        "handoff" => {
            let s = UnixStream::connect(&sock).unwrap();
            wire::send_with_fds(3, b"s", &[s.as_raw_fd()]).unwrap();
        }
        // Connect, say hello with a probe, hand the connection, its memfd
        // and the target's eventfd to the parent, and on its word exec
        // another program (same pid, same pidfd, other memory).
        "exec" => {
            let s = UnixStream::connect(&sock).unwrap();
            let nonce = Box::new(0xfeed_0000_0000_0001u64 ^ std::process::id() as u64);
            let hello = probe_hello(&nonce);
            let fd = wire::memfd_sealed("helper", hello.total).unwrap();
            wire::send_with_fds(s.as_raw_fd(), &hello.encode(), &[fd.as_raw_fd()]).unwrap();
            let mut ack = [0u8; wire::ACK_LEN];
            let (n, fds) = wire::recv_with_fds(s.as_raw_fd(), &mut ack).unwrap();
            assert_eq!(n, wire::ACK_LEN);
            let flags = wire::check_ack(&ack).unwrap().1;
            let mut msg = [0u8; 24];
            msg[..8].copy_from_slice(&flags.to_le_bytes());
            msg[8..16].copy_from_slice(&hello.probe.to_le_bytes());
            msg[16..].copy_from_slice(&hello.nonce.to_le_bytes());
            let wake = fds[0].as_raw_fd();
            wire::send_with_fds(3, &msg, &[s.as_raw_fd(), fd.as_raw_fd(), wake]).unwrap();
            let mut go = [0u8; 1];
            wire::recv_exact(3, &mut go).unwrap();
            let e = Command::new("/bin/sleep").arg("30").exec();
            panic!("exec sleep: {e}");
        }
        other => panic!("unknown helper mode {other}"),
    }
}

/// Direct reads are for the process that connected, with the credentials it
/// connected with; otherwise the connection works without them (the client
/// copies through the region), and the engine says why in its log.
#[test]
fn direct_reads_only_of_the_process_that_connected_with_its_credentials() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let sock = socket(&c);

    // An ordinary client: direct reads.
    let nonce = Box::new(0x1234_5678u64);
    let raw = raw_connect_with(&sock, probe_hello(&nonce));
    assert_ne!(raw.ack_flags & wire::ACK_CMA, 0, "{}", c.logs());

    // Connected as root, said hello as nobody: credentials changed.
    let out = helper_cmd("setuid", &sock, None).output().unwrap();
    assert!(out.status.success(), "helper failed");
    assert_eq!(
        helper_output(&out.stdout, "ACK_FLAGS").as_deref(),
        Some("0"),
        "a process whose uid changed after connecting still gets a connection, without direct reads"
    );
    wait_log(
        &c,
        "its credentials changed since it connected as uid 0 gid 0",
    );

    // Connected by one process, used by another after the first exited: the
    // engine's pidfd is of the first, so no reads of the second's memory.
    let (mine, theirs) = UnixStream::pair().unwrap();
    let mut child = helper_cmd("handoff", &sock, Some(&theirs)).spawn().unwrap();
    drop(theirs);
    let mut b = [0u8; 1];
    let (_, fds) = wire::recv_with_fds(mine.as_raw_fd(), &mut b).unwrap();
    let [fd]: [OwnedFd; 1] = fds.try_into().unwrap();
    let child_pid = child.id();
    assert!(child.wait().unwrap().success());
    let handed = raw_handshake(UnixStream::from(fd), probe_hello(&nonce));
    assert_eq!(
        handed.ack_flags & wire::ACK_CMA,
        0,
        "direct reads for a process other than the one that connected"
    );
    wait_log(
        &c,
        &format!("shm pid {child_pid}: no direct reads of its memory"),
    );
    assert!(handed.ping(1), "the handed-over connection works");
    assert!(raw.ping(2));
}

/// A client process that execs after its hello keeps its pid (and the
/// engine's pidfd) but not its memory: the next direct read finds the probe
/// word changed, is refused, and the connection is closed.
#[test]
fn a_client_that_execs_after_its_hello_is_refused() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let sock = socket(&c);
    let addr = object_address(&c);

    let (mine, theirs) = UnixStream::pair().unwrap();
    let mut child = helper_cmd("exec", &sock, Some(&theirs)).spawn().unwrap();
    drop(theirs);
    let mut msg = [0u8; 24];
    let (n, fds) = wire::recv_with_fds(mine.as_raw_fd(), &mut msg).unwrap();
    assert_eq!(n, 24);
    let [s, memfd, wake]: [OwnedFd; 3] = fds.try_into().unwrap();
    let u = |i: usize| u64::from_le_bytes(msg[i..i + 8].try_into().unwrap());
    let (flags, probe, nonce) = (u(0), u(8), u(16));
    assert_ne!(flags & wire::ACK_CMA, 0, "the helper got direct reads");
    let hello = Hello::standard(REGION_LEN, 0);
    // SAFETY: a duplicate of the memfd, for the unused page field.
    let page = unsafe { OwnedFd::from_raw_fd(libc::dup(memfd.as_raw_fd())) };
    let raw = Raw {
        s: UnixStream::from(s),
        map: Mapping::map(memfd.as_raw_fd(), hello.total).unwrap(),
        hello,
        wake,
        page,
        ack_flags: flags,
    };

    // Before the exec: the engine reads the child's memory (its nonce, as
    // an 8-byte value whose bytes this test knows).
    let value = nonce.to_ne_bytes();
    let update = |dkey: &[u8], epoch: u64| {
        let list = RemotePart::encode_all(&[RemotePart {
            addr: probe,
            len: 8,
        }]);
        update_frame(&addr, dkey, epoch, &value, &list, wire::FLAG_BULK_REMOTE).0
    };
    let f = update(b"before", 1);
    raw.write(&f);
    let (resp, _) = raw.call(f.len() as u64);
    assert_eq!(resp.status.map_or(0, |s| s.code), 0, "{}", c.logs());
    let (v, bytes) = raw.fetch(&addr, b"before", 0, 8);
    let (st, size) = (v.status, v.size);
    assert_eq!((st, size, &bytes[..]), (0, 8, &value[..]));

    // The child execs /bin/sleep: same pid, other program.
    let pid = child.id();
    std::io::Write::write_all(&mut &mine, b"g").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_link(format!("/proc/{pid}/exe"))
        .map_or(true, |p| !p.to_string_lossy().contains("sleep"))
    {
        assert!(Instant::now() < deadline, "the helper did not exec");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        raw.ping(3),
        "the connection outlives the exec (the test holds it)"
    );
    let f = update(b"after", 2);
    raw.write(&f);
    raw.post(f.len() as u64);
    let code = raw.response().map(|(r, _)| r.status.map_or(0, |s| s.code));
    refused_and_closed(&raw, code, "a direct read of a process that exec'd");
    wait_log(
        &c,
        &format!("shm pid {pid}: closing connection: direct read refused"),
    );
    let log = c.engines[0].log_text();
    assert!(log.contains("probe word"), "{log}");
    let good = raw_connect(&sock, 0);
    let (v, _) = good.fetch(&addr, b"after", 0, 8);
    let (st, size) = (v.status, v.size);
    assert_eq!((st, size), (0, 0), "nothing stored after the exec");
    assert!(good.ping(4));
    let _ = child.kill();
    let _ = child.wait();
}

/// The request was refused (an error answer, or none) and the connection is
/// closed.
fn refused_and_closed(raw: &Raw, code: Option<i32>, what: &str) {
    assert_ne!(code, Some(0), "{what}: stored");
    assert!(!raw.ping(77), "{what}: the connection is still open");
}

/// The probe word is read with every direct read: a client whose probe no
/// longer holds the nonce (here overwritten in place) is refused and closed.
#[test]
fn a_changed_probe_word_closes_the_connection() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let sock = socket(&c);
    let addr = object_address(&c);
    let mut nonce = Box::new(0xabcd_ef01_2345_6789u64);
    let raw = raw_connect_with(&sock, probe_hello(&nonce));
    assert_ne!(raw.ack_flags & wire::ACK_CMA, 0);
    let value = pattern(4, 256 << 10);
    assert_eq!(raw.update_remote(&addr, b"d1", 1, &value), Some(0));
    let (v, bytes) = raw.fetch(&addr, b"d1", 0, value.len() as u64);
    let (st, _) = (v.status, v.size);
    assert!(st == 0 && bytes == value);
    // SAFETY: a volatile write to our own box, which the engine reads.
    unsafe { std::ptr::write_volatile(&mut *nonce, 7) };
    let code = raw.update_remote(&addr, b"d2", 2, &value);
    refused_and_closed(&raw, code, "a direct read with the probe word changed");
    wait_log(&c, "no longer holds its nonce");
    let good = raw_connect(&sock, 0);
    assert_eq!(good.fetch(&addr, b"d2", 0, 16).0.size, 0, "nothing stored");
    assert!(good.ping(1));
}

/// The socket's mode and group, and the allowed uids: a peer the mode keeps
/// out cannot connect; one not in `allowed_uids` is closed with a logged
/// reason; an allowed one is served.
#[test]
fn the_socket_is_restricted_by_mode_group_and_uid() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let as_nobody = |sock: &Path| {
        let out = helper_cmd("as-is", sock, None)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        assert!(out.status.success(), "helper as nobody failed");
        (
            helper_output(&out.stdout, "CONNECT").unwrap_or_default(),
            helper_output(&out.stdout, "ACK_FLAGS").unwrap_or_default(),
        )
    };
    // Default: 0660, the engine's group; nobody cannot connect.
    let c = Cluster::start(spec());
    c.format();
    let sock = socket(&c);
    let m = std::fs::metadata(&sock).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o660);
    // SAFETY: getegid has no failure mode.
    assert_eq!(m.gid(), unsafe { libc::getegid() });
    std::fs::set_permissions(c.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (connect, _) = as_nobody(&sock);
    assert_eq!(connect, format!("err {}", libc::EACCES));
    assert!(raw_connect(&sock, 0).ping(1), "root is served");
    wait_log(&c, "shared-memory data plane on");
    assert!(c.engines[0].log_text().contains("(mode 0660)"));

    // Group nogroup and allowed uids [nobody]: nobody is served (through
    // the group's permission), root is closed with the reason logged.
    let c = Cluster::start_configured(
        spec(),
        &format!("shm: {{socket_group: \"{NOBODY}\", allowed_uids: [{NOBODY}]}}\n"),
    );
    c.format();
    let sock = socket(&c);
    let m = std::fs::metadata(&sock).unwrap();
    assert_eq!((m.mode() & 0o7777, m.gid()), (0o660, NOBODY));
    std::fs::set_permissions(c.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let (connect, flags) = as_nobody(&sock);
    assert_eq!(connect, "ok");
    assert!(
        flags == "0" || flags == "1",
        "nobody gets a connection: {flags:?}\n{}",
        c.logs()
    );
    // Closed before its hello is read.
    let s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    expect_closed(&s, "root not in allowed_uids");
    wait_log(&c, "uid 0 is not in shm.allowed_uids [65534]");
    // The library falls back to TCP for a socket it may not use.
    let client =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Auto).unwrap();
    c.create_pool(64, "S1", "off");
    let cont = client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 1)).unwrap();
    obj.update_single(b"d", b"a", b"tcp").unwrap();
    assert_eq!(obj.fetch_single(b"d", b"a").unwrap().unwrap(), b"tcp");
}

/// Anonymous memory whose page faults nobody serves (a userfaultfd range:
/// as an mmap of a file on a hung FUSE mount, any access blocks until the
/// fault is resolved).
struct Hung {
    uffd: OwnedFd,
    addr: *mut u8,
    len: usize,
}

impl Hung {
    fn new(len: usize) -> Hung {
        // SAFETY: userfaultfd set-up on a fresh anonymous mapping of ours.
        unsafe {
            let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK);
            assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
            let uffd = OwnedFd::from_raw_fd(fd as i32);
            let mut api = [0xAAu64, 0, 0];
            assert_eq!(
                libc::ioctl(uffd.as_raw_fd(), 0xc018aa3f, api.as_mut_ptr()),
                0
            );
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED);
            // start, len, mode MISSING, ioctls
            let mut reg = [addr as u64, len as u64, 1, 0];
            assert_eq!(
                libc::ioctl(uffd.as_raw_fd(), 0xc020aa00, reg.as_mut_ptr()),
                0,
                "UFFDIO_REGISTER: {}",
                std::io::Error::last_os_error()
            );
            Hung {
                uffd,
                addr: addr as *mut u8,
                len,
            }
        }
    }
}

/// A client whose values are in memory that never pages in stalls its own
/// connection only: the target serves its other clients throughout, the
/// engine's memory stays put, and once the memory is released the stalled
/// update completes.
#[test]
fn a_hung_client_mapping_never_stalls_the_target() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let sock = socket(&c);
    let addr = object_address(&c);
    let pid = c.engines[0].child.as_ref().unwrap().id();
    let nonce = Box::new(0x4a4a_0000_1111u64);
    let stuck = raw_connect_with(&sock, probe_hello(&nonce));
    assert_ne!(stuck.ack_flags & wire::ACK_CMA, 0);
    let other = raw_connect(&sock, 0);
    assert!(other.ping(1));
    let rss0 = proc_status(pid, "VmRSS");

    let hung = Hung::new(1 << 20);
    // The update's CRC is of zeros: what the memory reads as once released.
    let zeros = vec![0u8; hung.len];
    let list = RemotePart::encode_all(&[RemotePart {
        addr: hung.addr as u64,
        len: hung.len as u64,
    }]);
    let (f, _) = update_frame(&addr, b"hung", 1, &zeros, &list, wire::FLAG_BULK_REMOTE);
    stuck.write(&f);
    stuck.post(f.len() as u64);

    // Target 0 keeps serving another connection: in-region updates, fetches
    // and pings, each promptly, for 3 s.
    let value = pattern(8, 1 << 20);
    let t = Instant::now();
    let mut rounds = 0u64;
    let mut slowest = Duration::ZERO;
    while t.elapsed() < Duration::from_secs(3) {
        let r = Instant::now();
        let dkey = format!("o{}", rounds % 4).into_bytes();
        let (f, _) = update_frame(&addr, &dkey, 10 + rounds, &value, &value, 0);
        other.write(&f);
        let (resp, _) = other.call(f.len() as u64);
        assert_eq!(resp.status.map_or(0, |s| s.code), 0);
        let (v, bytes) = other.fetch(&addr, &dkey, 0, value.len() as u64);
        let (st, _) = (v.status, v.size);
        assert!(st == 0 && bytes == value);
        assert!(other.ping(rounds));
        slowest = slowest.max(r.elapsed());
        rounds += 1;
    }
    assert!(
        slowest < Duration::from_secs(1),
        "the other client waited {slowest:?}"
    );
    assert!(!stuck.answered(), "the hung update cannot have been served");
    // The library's clients too, over shared memory, on either target.
    let client =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Shm).unwrap();
    let cont = client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    for i in 0..8 {
        let obj = cont
            .object(ObjectId::new(ObjectClass::S1, 0, 500 + i))
            .unwrap();
        obj.update_array(b"d", b"a", 0, &value).unwrap();
        assert!(obj.fetch_array(b"d", b"a", 0, value.len()).unwrap() == value);
    }
    let rss1 = proc_status(pid, "VmRSS");
    eprintln!(
        "hung mapping: {rounds} rounds of 1 MiB update + fetch + ping on the same target in 3 s, \
         slowest {slowest:?}; engine VmRSS {} -> {} MiB",
        rss0 >> 20,
        rss1 >> 20
    );
    assert!(
        rss1 < rss0 + (256 << 20),
        "engine memory grew from {rss0} to {rss1}"
    );

    // Released (the userfaultfd closed: the faults resolve to zero pages),
    // the stalled update completes and the connection carries on.
    drop(hung.uffd);
    let (resp, _) = stuck.response().expect("the stalled update is answered");
    assert_eq!(resp.status.map_or(0, |s| s.code), 0, "{}", c.logs());
    let (v, bytes) = stuck.fetch(&addr, b"hung", 0, zeros.len() as u64);
    let (st, _) = (v.status, v.size);
    assert!(st == 0 && bytes == zeros);
    assert!(stuck.ping(99));
}
