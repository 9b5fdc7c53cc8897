//! Engines started with `--metrics-listen` serve Prometheus metrics: the
//! counters move with the I/O done through the client library (over TCP
//! and over shared memory), the text parses, and the endpoint answers
//! `GET /metrics` only, with bounded input.

mod common;
use common::*;
use peregrine::{Client, ObjectClass, ObjectId, TransportKind};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// Engines with metrics on a free port each; returns their metrics addresses.
fn cluster_with_metrics(spec: ClusterSpec) -> (Cluster, Vec<String>) {
    let addrs: Vec<String> = (0..spec.engines)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let a = addrs.clone();
    let c = Cluster::start_with_args(spec, "", move |rank| {
        vec!["--metrics-listen".into(), a[rank as usize].clone()]
    });
    (c, addrs)
}

/// Send `request` as is and read the reply to its end: (status, head, body).
fn http(addr: &str, request: &[u8]) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(request).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).expect("UTF-8 reply");
    let (head, body) = text.split_once("\r\n\r\n").expect("a reply head");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line of {head:?}"));
    (status, head.to_string(), body.to_string())
}

fn get(addr: &str, path: &str) -> (u16, String, String) {
    http(
        addr,
        format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
    )
}

/// One sample of the text format.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parse the Prometheus text format strictly: every line a HELP, a TYPE or
/// a sample of a family whose TYPE came before it, label values quoted.
fn parse(text: &str) -> Vec<Sample> {
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').expect("TYPE name type");
            assert!(
                ["counter", "gauge", "histogram", "info", "unknown"].contains(&ty),
                "{line}"
            );
            types.insert(name.into(), ty.into());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.is_empty() && !line.starts_with('#'), "line {line:?}");
        let (series, value) = line.rsplit_once(' ').expect("sample: series value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("value of {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, BTreeMap::new()),
            Some((n, l)) => (n, parse_labels(l.strip_suffix('}').expect("labels end"))),
        };
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "metric name in {line:?}"
        );
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|b| types.get(*b).map(String::as_str) == Some("histogram"))
            })
            .unwrap_or(name);
        assert!(types.contains_key(family), "sample before its TYPE: {line}");
        out.push(Sample {
            name: name.into(),
            labels,
            value,
        });
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = s;
    while !rest.is_empty() {
        let (k, v) = rest.split_once("=\"").expect("label=\"value\"");
        let mut val = String::new();
        let mut chars = v.char_indices();
        let end = loop {
            match chars.next().expect("closing quote") {
                (i, '"') => break i,
                (_, '\\') => val.push(chars.next().expect("escaped char").1),
                (_, c) => val.push(c),
            }
        };
        out.insert(k.to_string(), val);
        rest = v[end + 1..].trim_start_matches(',');
    }
    out
}

/// Scrape one engine: its samples (checked to parse).
fn scrape(addr: &str) -> Vec<Sample> {
    let (status, head, body) = get(addr, "/metrics");
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    parse(&body)
}

/// Sum of the samples named `name` whose labels include `with`.
fn sum(samples: &[Sample], name: &str, with: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .filter(|s| {
            with.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Sum over every engine.
fn sum_all(addrs: &[String], name: &str, with: &[(&str, &str)]) -> f64 {
    addrs.iter().map(|a| sum(&scrape(a), name, with)).sum()
}

/// Wait until `f` holds (what the targets publish may lag by a second).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !f() {
        assert!(Instant::now() < deadline, "{what}: not within 10 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Write `n` 1 MiB values and read them back through `client`.
fn write_and_read(client: &Client, oid: u64, n: usize) {
    let cont = client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    let obj = cont.object(ObjectId::new(ObjectClass::SX, 0, oid)).unwrap();
    for i in 0..n {
        let v = pattern(oid * 100 + i as u64, MIB);
        obj.update_array(format!("d{i}").as_bytes(), b"a", 0, &v)
            .unwrap();
    }
    for i in 0..n {
        let v = obj
            .fetch_array(format!("d{i}").as_bytes(), b"a", 0, MIB)
            .unwrap();
        assert!(
            v == pattern(oid * 100 + i as u64, MIB),
            "value {i} read back"
        );
    }
}

#[test]
fn counters_move_with_io_over_tcp_and_shared_memory() {
    let (c, addrs) = cluster_with_metrics(ClusterSpec {
        engines: 2,
        targets: 2,
        device_mib: 256,
        scm_mib: 64,
    });
    c.format();
    c.create_pool(256, "SX", "crc32c");
    let tcp =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Tcp).unwrap();
    let pool = tcp.pool_connect("pool").unwrap().uuid().to_string();
    let p = [("pool", pool.as_str())];

    // The pool shows before any I/O, at zero, on every target.
    eventually("the new pool's series", || {
        sum_all(
            &addrs,
            "peregrine_pool_targets",
            &[("pool", &pool), ("state", "upin")],
        ) == 4.0
    });
    for a in &addrs {
        let s = scrape(a);
        assert_eq!(sum(&s, "peregrine_engine_ready", &[]), 1.0);
        let series = s
            .iter()
            .filter(|x| {
                x.name == "peregrine_target_update_bytes_total"
                    && x.labels.get("pool") == Some(&pool)
            })
            .count();
        assert_eq!(series, 2, "one series per target");
        assert_eq!(sum(&s, "peregrine_target_update_bytes_total", &p), 0.0);
        assert_eq!(
            sum(
                &s,
                "peregrine_pool_targets",
                &[("pool", &pool), ("state", "down")]
            ),
            0.0
        );
    }

    write_and_read(&tcp, 1, 8);
    let written = (8 * MIB) as f64;
    let moved = sum_all(&addrs, "peregrine_target_update_bytes_total", &p);
    assert!(
        moved >= written && moved < 2.0 * written,
        "update bytes {moved} after {written} written"
    );
    assert!(sum_all(&addrs, "peregrine_target_fetch_bytes_total", &p) >= written);

    let shm =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Shm).unwrap();
    write_and_read(&shm, 2, 8);
    let written = (16 * MIB) as f64;
    let moved = sum_all(&addrs, "peregrine_target_update_bytes_total", &p);
    assert!(
        moved >= written,
        "update bytes {moved} after {written} written over both transports"
    );
    assert!(sum_all(&addrs, "peregrine_target_fetch_bytes_total", &p) >= written);

    let update = [("pool", pool.as_str()), ("op", "update")];
    let fetch = [("pool", pool.as_str()), ("op", "fetch")];
    assert!(sum_all(&addrs, "peregrine_target_ops_total", &update) >= 16.0);
    assert!(sum_all(&addrs, "peregrine_target_ops_total", &fetch) >= 16.0);
    assert_eq!(
        sum_all(&addrs, "peregrine_target_op_failures_total", &p),
        0.0
    );
    assert_eq!(
        sum_all(&addrs, "peregrine_target_checksum_errors_total", &p),
        0.0
    );
    assert_eq!(sum_all(&addrs, "peregrine_target_io_errors_total", &p), 0.0);

    for a in &addrs {
        let s = scrape(a);
        // Histograms: cumulative buckets ending at +Inf with the count; one
        // observation per successful request.
        for h in [
            "peregrine_target_update_latency_seconds",
            "peregrine_target_fetch_latency_seconds",
        ] {
            for t in ["0", "1"] {
                let at = [("pool", pool.as_str()), ("target", t)];
                let buckets: Vec<&Sample> = s
                    .iter()
                    .filter(|x| x.name == format!("{h}_bucket"))
                    .filter(|x| {
                        at.iter()
                            .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
                    })
                    .collect();
                assert!(buckets.len() > 10, "{h} buckets");
                assert!(
                    buckets.windows(2).all(|w| w[0].value <= w[1].value),
                    "{h} cumulative"
                );
                let last = buckets.last().unwrap();
                assert_eq!(last.labels["le"], "+Inf");
                assert_eq!(last.value, sum(&s, &format!("{h}_count"), &at));
                let op = if h.contains("update") {
                    "update"
                } else {
                    "fetch"
                };
                let ops = sum(
                    &s,
                    "peregrine_target_ops_total",
                    &[("pool", &pool), ("target", t), ("op", op)],
                );
                assert_eq!(
                    last.value, ops,
                    "{h} target {t}: one observation per request"
                );
                if ops > 0.0 {
                    assert!(sum(&s, &format!("{h}_sum"), &at) > 0.0);
                }
            }
        }
        assert!(sum(&s, "peregrine_target_wal_records_total", &[]) >= 1.0);
        assert_eq!(
            sum(&s, "peregrine_target_queue_depth", &[]),
            0.0,
            "nothing in flight"
        );
        assert_eq!(sum(&s, "peregrine_target_faulted", &[]), 0.0);
        assert!(sum(&s, "peregrine_target_space_size_bytes", &[("tier", "nvme")]) > 0.0);
        assert!(sum(&s, "peregrine_target_space_size_bytes", &[("tier", "scm")]) > 0.0);
        assert!(
            sum(
                &s,
                "peregrine_pool_space_size_bytes",
                &[("pool", &pool), ("tier", "nvme")]
            ) > 0.0
        );
        assert!(
            s.iter().all(|x| x.labels.contains_key("rank")),
            "every series names its rank"
        );
    }
    // Acknowledged updates are flushed within the flush interval (1 s), and
    // the space the targets publish catches up.
    eventually("device flushes", || {
        addrs
            .iter()
            .all(|a| sum(&scrape(a), "peregrine_target_wal_flushes_total", &[]) >= 1.0)
    });
    // Each engine learns the pool's map with its next heartbeat.
    eventually("the pool map version", || {
        addrs
            .iter()
            .all(|a| sum(&scrape(a), "peregrine_pool_map_version", &p) >= 1.0)
    });
    eventually("the pool's used space", || {
        let used = sum_all(
            &addrs,
            "peregrine_pool_space_used_bytes",
            &[("pool", &pool), ("tier", "nvme")],
        );
        let target_used = sum_all(
            &addrs,
            "peregrine_target_space_used_bytes",
            &[("tier", "nvme")],
        );
        used >= written && target_used >= used
    });
}

#[test]
fn endpoint_serves_get_metrics_only_with_bounded_input() {
    let (c, addrs) = cluster_with_metrics(ClusterSpec {
        engines: 1,
        targets: 1,
        device_mib: 128,
        scm_mib: 64,
    });
    let a = &addrs[0];
    // Unformatted: maintenance mode, no targets, but metrics all the same.
    let s = scrape(a);
    assert_eq!(sum(&s, "peregrine_engine_ready", &[]), 0.0);
    assert!(!s.iter().any(|x| x.name.starts_with("peregrine_target_")));

    for path in ["/", "/metrics/", "/metricsx", "/debug/pprof", "/../metrics"] {
        assert_eq!(get(a, path).0, 404, "{path}");
    }
    let post =
        "POST /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 5\r\n\r\nhello";
    let (status, head, _) = http(a, post.as_bytes());
    assert_eq!(status, 405);
    assert!(head.to_ascii_lowercase().contains("allow: get"), "{head}");
    assert_eq!(
        http(
            a,
            b"DELETE /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .0,
        405
    );
    // Not HTTP at all, and a head larger than the engine buffers.
    assert_eq!(http(a, b"\x16\x03\x01 hello engine\r\n\r\n").0, 400);
    let huge = format!(
        "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n",
        "y".repeat(64 << 10)
    );
    let (status, _, _) = http(a, huge.as_bytes());
    assert!(status == 431 || status == 400, "{status}");

    // OpenMetrics for a scraper that asks for it.
    let (status, head, body) = http(
        a,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(head.contains("application/openmetrics-text"), "{head}");
    assert!(body.ends_with("# EOF\n"));

    // Connections that never send a request hold every slot until the
    // header timeout drops them; a scraper is served after that, and the
    // engine carries on.
    let t0 = Instant::now();
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(a.as_str()).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let s = scrape(a);
    assert_eq!(sum(&s, "peregrine_engine_ready", &[]), 0.0);
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "served after {:?}",
        t0.elapsed()
    );
    drop(idle);
    c.format();
    eventually("the engine ready in its metrics", || {
        sum(&scrape(a), "peregrine_engine_ready", &[]) == 1.0
    });
}

#[test]
fn a_corrupt_extent_counts_as_a_checksum_error() {
    let (mut c, addrs) = cluster_with_metrics(ClusterSpec {
        engines: 1,
        targets: 1,
        device_mib: 128,
        scm_mib: 64,
    });
    c.format();
    c.create_pool(64, "S1", "crc32c");
    let val = pattern(91, 64 * 1024);
    {
        let cont = c.container();
        let obj = cont.object(ObjectId::new(ObjectClass::S1, 9, 9)).unwrap();
        obj.update_array(b"d", b"a", 0, &val).unwrap();
    }
    c.engines[0].stop();
    let dev = c.engines[0].device.clone();
    let mut data = read_file(&dev);
    let at = find_bytes(&data, &val[20_000..20_064]).expect("value on the device");
    data[at + 32] ^= 0x40;
    std::fs::write(&dev, &data).unwrap();
    c.restart(0);
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 9, 9)).unwrap();
    let err = obj
        .fetch_array(b"d", b"a", 0, val.len())
        .expect_err("corrupt data read");
    assert_eq!(err.code, -libc::EILSEQ, "{err}");
    let s = scrape(&addrs[0]);
    assert!(sum(&s, "peregrine_target_checksum_errors_total", &[]) >= 1.0);
    assert_eq!(sum(&s, "peregrine_target_io_errors_total", &[]), 0.0);
}
