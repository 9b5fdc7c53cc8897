use super::*;

const GOOD: &str = "
name: tank
rank: 1
control_port: 10002
targets: 2
scm: {class: ram, size: 1GiB}
bdev: {class: file, path: /tmp/nvme.img, size: 4GiB}
mgmt_svc_replicas: [\"127.0.0.1:10001\"]
allow_insecure: true
";

#[test]
fn parses_good_config() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.rank, 1);
    assert_eq!(c.scm.size.0, 1 << 30);
    assert!(matches!(c.bdev, BdevConfig::File { ref size, .. } if size.0 == 4 << 30));
    assert!(!c.hosts_mgmt());
    assert_eq!(c.control_port, 10002);
}

#[test]
fn rejects_with_the_key_named() {
    let cases = [
        (
            GOOD.replace("targets: 2", "targets: 2\ntargetz: 3"),
            "targetz",
        ),
        (GOOD.replace("targets: 2", "targets: 0"), "targets"),
        (GOOD.replace("size: 4GiB", "size: 4XB"), "4XB"),
        (GOOD.replace("size: 4GiB", "size: 1MiB"), "bdev.size"),
        (GOOD.replace("class: ram", "class: pmem"), "scm.class"),
        (GOOD.replace("class: file", "class: tape"), "tape"),
        (GOOD.replace("rank: 1", "rank: -1"), "rank"),
        (
            GOOD.replace("\"127.0.0.1:10001\"", "\"nohost\""),
            "mgmt_svc_replicas",
        ),
        (format!("{GOOD}log_level: loud\n"), "log_level"),
        (format!("{GOOD}shm_dir: run/x\n"), "shm_dir"),
        (format!("{GOOD}shm_dir: /{}\n", "x".repeat(120)), "shm_dir"),
        (
            format!("{GOOD}data_plane: {{max_connections: 0}}\n"),
            "data_plane.max_connections",
        ),
        (
            format!("{GOOD}data_plane: {{read_timeout_ms: 5}}\n"),
            "data_plane.read_timeout_ms",
        ),
        (
            format!("{GOOD}data_plane: {{max_unread_reply_bytes: 4KiB}}\n"),
            "data_plane.max_unread_reply_bytes",
        ),
        (
            format!("{GOOD}data_plane: {{idle_timeout: 5}}\n"),
            "idle_timeout",
        ),
        (format!("{GOOD}shm: {{socket_mode: 660}}\n"), "quoted octal"),
        (
            format!("{GOOD}shm: {{socket_mode: 0o660}}\n"),
            "quoted octal",
        ),
        (format!("{GOOD}shm: {{socket_mode: \"0980\"}}\n"), "0980"),
        (
            format!("{GOOD}shm: {{socket_mode: \"0060\"}}\n"),
            "shm.socket_mode",
        ),
        (
            format!("{GOOD}shm: {{max_connections: 0}}\n"),
            "shm.max_connections",
        ),
        (
            format!("{GOOD}control_plane: {{max_message_bytes: 1KiB}}\n"),
            "control_plane.max_message_bytes",
        ),
        (
            format!("{GOOD}control_plane: {{keepalive_s: 0}}\n"),
            "control_plane.keepalive_s",
        ),
    ];
    for (text, key) in cases {
        let err = Config::parse(&text).unwrap_err();
        assert!(err.contains(key), "error {err:?} does not name {key}");
    }
}

#[test]
fn control_plane_security_is_one_explicit_choice() {
    let bare = GOOD.replace("allow_insecure: true\n", "");
    let e = Config::parse(&bare).unwrap_err();
    assert!(e.contains("tls_dir") && e.contains("allow_insecure"), "{e}");
    let e = Config::parse(&format!("{GOOD}tls_dir: /etc/peregrine/tls\n")).unwrap_err();
    assert!(e.contains("tls_dir") && e.contains("allow_insecure"), "{e}");
    let c = Config::parse(&format!("{bare}tls_dir: /etc/peregrine/tls\n")).unwrap();
    assert_eq!(c.security(), peregrine::Security::tls("/etc/peregrine/tls"));
    assert_eq!(
        Config::parse(GOOD).unwrap().security(),
        peregrine::Security::Insecure
    );
}

#[test]
fn data_plane_limits() {
    let d = Config::parse(GOOD).unwrap().data_plane;
    assert_eq!(d.max_connections, 4096);
    assert_eq!(d.read_timeout_ms, 30_000);
    assert_eq!(d.idle_timeout_s, 600);
    assert_eq!(d.max_unread_reply_bytes.0, 64 << 20);
    let c = Config::parse(&format!(
        "{GOOD}data_plane:\n  max_connections: 8\n  idle_timeout_s: 0\n  max_unread_reply_bytes: 16MiB\n"
    ))
    .unwrap();
    assert_eq!(c.data_plane.max_connections, 8);
    assert_eq!(c.data_plane.idle_timeout_s, 0);
    assert_eq!(c.data_plane.max_unread_reply_bytes.0, 16 << 20);
    assert_eq!(c.data_plane.target_queue_depth, 1024);
}

#[test]
fn shm_and_control_plane_limits() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.shm.socket_mode, Mode(0o660));
    assert!(c.shm.socket_group.is_none() && c.shm.allowed_uids.is_empty());
    assert_eq!(c.control_plane.max_message_bytes.0, 16 << 20);
    let c = Config::parse(&format!(
        "{GOOD}shm: {{socket_mode: \"0o600\", socket_group: \"1234\", allowed_uids: [0, 1000]}}\ncontrol_plane: {{max_connections: 8}}\n"
    ))
    .unwrap();
    assert_eq!(c.shm.socket_mode, Mode(0o600));
    assert_eq!(c.shm.socket_group.as_deref(), Some("1234"));
    assert_eq!(c.shm.allowed_uids, [0, 1000]);
    assert_eq!(c.control_plane.max_connections, 8);
    // A bare leading-zero mode reads as the octal it looks like.
    let c = Config::parse(&format!("{GOOD}shm: {{socket_mode: 0640}}\n")).unwrap();
    assert_eq!(c.shm.socket_mode, Mode(0o640));
    let c = Config::parse(&format!("{GOOD}shm: {{socket_mode: \"0o600\"}}\n")).unwrap();
    assert_eq!(c.shm.socket_mode, Mode(0o600));
}

#[test]
fn shm_socket_defaults() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.shm_socket(), Path::new("/tmp/peregrine-rank1.sock"));
    let c = Config::parse(&format!("{GOOD}shm_dir: /run/prg\n")).unwrap();
    assert_eq!(c.shm_socket(), Path::new("/run/prg/peregrine-rank1.sock"));
    let c = Config::parse(&GOOD.replace(
        "{class: file, path: /tmp/nvme.img, size: 4GiB}",
        "{class: kdev, device: /dev/loop0}",
    ))
    .unwrap();
    assert_eq!(
        c.shm_socket(),
        Path::new("/run/peregrine/peregrine-rank1.sock")
    );
}

#[test]
fn scm_value_max_defaults_to_a_block_and_is_bounded() {
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(c.scm_value_max(), 4096);
    let c = Config::parse(&format!("{GOOD}scm_value_max: 1KiB\n")).unwrap();
    assert_eq!(crate::node::Node::storage_options(&c).scm_value_max, 1024);
    for bad in ["0", "8KiB"] {
        let e = Config::parse(&format!("{GOOD}scm_value_max: {bad}\n")).unwrap_err();
        assert!(
            e.contains("scm_value_max") && e.contains("1..=4096"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn wal_io_follows_the_bdev_unless_configured() {
    use peregrine_vos::WalIo;
    let c = Config::parse(GOOD).unwrap();
    assert_eq!(
        crate::node::Node::storage_options(&c).wal_io,
        WalIo::PageCache
    );
    let kdev = GOOD.replace(
        "{class: file, path: /tmp/nvme.img, size: 4GiB}",
        "{class: kdev, device: /dev/loop7}",
    );
    assert_eq!(
        crate::node::Node::storage_options(&Config::parse(&kdev).unwrap()).wal_io,
        WalIo::Direct
    );
    let c = Config::parse(&format!("{GOOD}wal_io: direct\n")).unwrap();
    assert_eq!(crate::node::Node::storage_options(&c).wal_io, WalIo::Direct);
    let c = Config::parse(&format!("{kdev}wal_io: page_cache\n")).unwrap();
    assert_eq!(
        crate::node::Node::storage_options(&c).wal_io,
        WalIo::PageCache
    );
    let e = Config::parse(&format!("{GOOD}wal_io: buffered\n")).unwrap_err();
    assert!(e.contains("wal_io") && e.contains("page_cache"), "{e}");
}

#[test]
fn vos_tuning_from_yaml_else_environment_else_defaults() {
    let none = |_: &str| None;
    let mut c = Config::parse(GOOD).unwrap();
    c.fill_from_env(none).unwrap();
    assert_eq!(c.vos_poll(), peregrine_vos::DEFAULT_POLL);
    assert_eq!(c.vos_read_spin(), peregrine_vos::DEFAULT_READ_SPIN);
    assert_eq!(c.scrub_rate(), peregrine_vos::DEFAULT_SCRUB_RATE);
    assert_eq!(c.vos_poll(), Duration::from_micros(200));
    assert_eq!(c.vos_read_spin(), Duration::from_micros(150));
    assert_eq!(c.scrub_rate(), 8 << 20);

    let yaml = format!("{GOOD}vos_poll_us: 0\nvos_spin_us: 40\nscrub_rate: 1MiB\n");
    let mut c = Config::parse(&yaml).unwrap();
    assert_eq!((c.vos_poll_us, c.vos_spin_us), (Some(0), Some(40)));
    // The YAML wins over the environment.
    c.fill_from_env(|_| Some("7".into())).unwrap();
    assert_eq!(c.vos_poll(), Duration::ZERO);
    assert_eq!(c.vos_read_spin(), Duration::from_micros(40));
    assert_eq!(c.scrub_rate(), 1 << 20);
    let opts = crate::node::Node::storage_options(&c);
    assert_eq!(
        (opts.poll, opts.read_spin, opts.scrub_rate),
        (Duration::ZERO, Duration::from_micros(40), 1 << 20)
    );
    let c = Config::parse(&format!("{GOOD}scrub_rate: 0\n")).unwrap();
    assert_eq!(c.scrub_rate(), 0);

    // Unset in the YAML: the old variables, when set.
    let env = |k: &str| match k {
        "PEREGRINE_VOS_POLL_US" => Some("0".to_string()),
        "PEREGRINE_VOS_SCRUB_RATE" => Some("4096".to_string()),
        _ => None,
    };
    let mut c = Config::parse(GOOD).unwrap();
    c.fill_from_env(env).unwrap();
    assert_eq!(c.vos_poll(), Duration::ZERO);
    assert_eq!(c.vos_read_spin(), peregrine_vos::DEFAULT_READ_SPIN);
    assert_eq!(c.scrub_rate(), 4096);

    let e = Config::parse(&format!("{GOOD}vos_spin_us: 2000000\n")).unwrap_err();
    assert!(e.contains("vos_spin_us"), "{e}");
    let e = Config::parse(&format!("{GOOD}vos_poll_us: -1\n")).unwrap_err();
    assert!(e.contains("vos_poll_us"), "{e}");
    let mut c = Config::parse(GOOD).unwrap();
    let e = c.fill_from_env(|_| Some("soon".into())).unwrap_err();
    assert!(e.contains("PEREGRINE_VOS_POLL_US"), "{e}");
}

/// What the operator's ConfigMap holds: the values all engines share.
const SHARED: &str = "
name: tank
control_port: 10001
data_port: 10101
targets: 2
scm: {class: ram, size: 1GiB}
bdev: {class: file, size: 4GiB}
mgmt_svc_replicas: [tank-0.tank.ns.svc:10001, tank-1.tank.ns.svc:10001]
allow_insecure: true
";

fn pod(rank: u32) -> Overrides {
    Overrides {
        rank: Some(rank),
        listen_addr: Some(IpAddr::from([10, 0, 0, 10 + rank as u8])),
        fault_domain: Some(format!("/node{rank}")),
        dns_name: Some(format!("tank-{rank}.tank.ns.svc")),
        bdev_path: Some(format!("/var/lib/peregrine/tank-nvme{rank}.img").into()),
    }
}

#[test]
fn overrides_complete_a_shared_config() {
    let e = Config::parse(SHARED).unwrap_err();
    assert!(e.contains("rank") && e.contains("--rank"), "{e}");
    let c = Config::parse_with(SHARED, &pod(1)).unwrap();
    assert_eq!(c.rank, 1);
    assert_eq!(c.listen_addr, IpAddr::from([10, 0, 0, 11]));
    assert_eq!(c.control_addr(), "10.0.0.11:10001");
    assert_eq!(c.fault_domain, "/node1");
    assert_eq!(c.dns_name.as_deref(), Some("tank-1.tank.ns.svc"));
    assert!(
        matches!(&c.bdev, BdevConfig::File { path, .. } if path == Path::new("/var/lib/peregrine/tank-nvme1.img"))
    );
    assert_eq!(
        c.shm_socket(),
        Path::new("/var/lib/peregrine/peregrine-rank1.sock")
    );
    // Without a device file: named like the key.
    let e = Config::parse_with(
        SHARED,
        &Overrides {
            bdev_path: None,
            ..pod(1)
        },
    )
    .unwrap_err();
    assert!(e.contains("bdev.path") && e.contains("--bdev-path"), "{e}");
}

#[test]
fn overrides_win_over_the_yaml() {
    let c = Config::parse_with(GOOD, &Overrides::default()).unwrap();
    assert_eq!((c.rank, c.fault_domain.as_str()), (1, "/"));
    let c = Config::parse_with(
        &format!("{GOOD}fault_domain: /rack1\nlisten_addr: 127.0.0.2\ndns_name: a.b\n"),
        &Overrides {
            rank: Some(0),
            listen_addr: Some(IpAddr::from([127, 0, 0, 3])),
            fault_domain: Some("/rack2".into()),
            dns_name: Some("c.d".into()),
            bdev_path: Some("/tmp/other.img".into()),
        },
    )
    .unwrap();
    assert_eq!(c.rank, 0);
    assert_eq!(c.listen_addr, IpAddr::from([127, 0, 0, 3]));
    assert_eq!(c.fault_domain, "/rack2");
    assert_eq!(c.dns_name.as_deref(), Some("c.d"));
    assert!(
        matches!(&c.bdev, BdevConfig::File { path, size } if path == Path::new("/tmp/other.img") && size.0 == 4 << 30)
    );
    // The rank alone: the rest stays the YAML's.
    let c = Config::parse_with(
        &format!("{GOOD}fault_domain: /rack1\n"),
        &Overrides {
            rank: Some(7),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!((c.rank, c.fault_domain.as_str()), (7, "/rack1"));
    assert_eq!(c.shm_socket(), Path::new("/tmp/peregrine-rank7.sock"));
}

#[test]
fn overrides_are_validated_as_the_yaml_is() {
    let bad = |o: Overrides, key: &str| {
        let e = Config::parse_with(GOOD, &o).unwrap_err();
        assert!(e.contains(key), "{o:?}: {e:?} does not name {key}");
    };
    for f in ["", "/a\nb", &"/x".repeat(200)] {
        bad(
            Overrides {
                fault_domain: Some(f.into()),
                ..Default::default()
            },
            "fault_domain",
        );
        // The same value from the YAML: the same refusal.
        let yaml = format!("{GOOD}fault_domain: \"{}\"\n", f.escape_default());
        let e = Config::parse(&yaml).unwrap_err();
        assert!(e.contains("fault_domain"), "{e}");
    }
    for n in ["", "tank-0..svc", "-tank", "tank_0.svc", "tank-0.svc:10001"] {
        bad(
            Overrides {
                dns_name: Some(n.into()),
                ..Default::default()
            },
            "dns_name",
        );
        let e = Config::parse(&format!("{GOOD}dns_name: \"{n}\"\n")).unwrap_err();
        assert!(e.contains("dns_name"), "{e}");
    }
    bad(
        Overrides {
            bdev_path: Some("".into()),
            ..Default::default()
        },
        "bdev.path",
    );
    // A kernel block device has no path to override.
    let kdev = GOOD.replace(
        "{class: file, path: /tmp/nvme.img, size: 4GiB}",
        "{class: kdev, device: /dev/nvme0n1}",
    );
    let e = Config::parse_with(
        &kdev,
        &Overrides {
            bdev_path: Some("/tmp/x.img".into()),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert!(e.contains("--bdev-path") && e.contains("kdev"), "{e}");
    // The listen address moves the control address, and so which entry is this engine.
    let c = Config::parse_with(
        GOOD,
        &Overrides {
            listen_addr: Some(IpAddr::from([127, 0, 0, 1])),
            rank: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert!(!c.hosts_mgmt(), "10001 is not this engine's control port");
    let c = Config::parse_with(
        &GOOD.replace("control_port: 10002", "control_port: 10001"),
        &Overrides::default(),
    )
    .unwrap();
    assert!(c.hosts_mgmt());
}

#[test]
fn the_replica_naming_this_engine_by_its_dns_name_is_this_engine() {
    let rank0 = Config::parse_with(SHARED, &pod(0)).unwrap();
    assert!(rank0.hosts_mgmt());
    assert!(rank0.is_self("tank-0.tank.ns.svc:10001"));
    assert!(rank0.is_self("TANK-0.tank.ns.svc.:10001"));
    assert!(rank0.is_self("10.0.0.10:10001"));
    assert!(!rank0.is_self("tank-0.tank.ns.svc:10002"), "another port");
    assert!(!rank0.is_self("tank-1.tank.ns.svc:10001"));
    // It reports to itself by its address: no name lookup of its own.
    assert_eq!(rank0.mgmt_leader(), "10.0.0.10:10001");

    let rank1 = Config::parse_with(SHARED, &pod(1)).unwrap();
    assert!(!rank1.hosts_mgmt());
    assert!(
        rank1.is_self("tank-1.tank.ns.svc:10001"),
        "a replica, not the first"
    );
    assert_eq!(rank1.mgmt_leader(), "tank-0.tank.ns.svc:10001");

    // Without its DNS name, rank 0 finds itself only by address (as before).
    let anon = Config::parse_with(
        SHARED,
        &Overrides {
            dns_name: None,
            ..pod(0)
        },
    )
    .unwrap();
    assert!(!anon.hosts_mgmt());
    let by_ip = Config::parse_with(
        &SHARED.replace("tank-0.tank.ns.svc:10001", "10.0.0.10:10001"),
        &Overrides {
            dns_name: None,
            ..pod(0)
        },
    )
    .unwrap();
    assert!(by_ip.hosts_mgmt());
    assert_eq!(by_ip.mgmt_leader(), "10.0.0.10:10001");
    // No replicas: every engine hosts its own; localhost and 0.0.0.0 name it too.
    let none = Config::parse_with(
        &SHARED.replace(
            "mgmt_svc_replicas: [tank-0.tank.ns.svc:10001, tank-1.tank.ns.svc:10001]\n",
            "",
        ),
        &pod(2),
    )
    .unwrap();
    assert!(none.hosts_mgmt());
    assert_eq!(none.mgmt_leader(), "10.0.0.12:10001");
    for host in ["localhost", "0.0.0.0"] {
        let c = Config::parse_with(&SHARED.replace("tank-0.tank.ns.svc", host), &pod(0)).unwrap();
        assert!(c.hosts_mgmt(), "{host}");
        assert_eq!(c.mgmt_leader(), format!("{host}:10001"));
    }
}

#[test]
fn sizes() {
    assert_eq!(parse_size("4096").unwrap(), 4096);
    assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
    assert_eq!(parse_size("100M").unwrap(), 100 << 20);
    assert!(parse_size("12XB").is_err());
    assert!(parse_size("").is_err());
}
