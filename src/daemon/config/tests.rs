//! Tests of the configuration files: parsing, each setting checked by
//! name, and rendering them back.

use super::*;

fn sample() -> PrimaryConfig {
    PrimaryConfig {
        data_dir: "/var/lib/twinlog".into(),
        listen: "0.0.0.0:7400".parse().expect("addr"),
        metrics: "127.0.0.1:9400".parse().expect("addr"),
        twin_fingerprint: Some(Fingerprint([1; 32])),
        client_fingerprints: vec![Fingerprint([2; 32])],
        writer_fingerprints: vec![Fingerprint([4; 32])],
        reader_fingerprints: vec![Fingerprint([5; 32])],
        durability: DurabilitySection {
            policy: Policy::Fallback,
            timeout_ms: 250,
        },
        segment_bytes: 1 << 20,
        timers: TimersSection {
            heartbeat_ms: 20,
            idle_timeout_ms: 300,
        },
        retention: RetentionSection { max_bytes: 1 << 30 },
        limits: Default::default(),
        failover: Some(FailoverSection {
            etcd: vec!["http://10.0.0.5:2379".into(), "http://10.0.0.6:2379".into()],
            cluster: "pair-1".into(),
            lease_ttl_s: 4,
            auto_rejoin: false,
            advertise: Some("db1.example:7400".parse().expect("addr")),
            peer: None,
        }),
        archive: Some(ArchiveSection {
            url: "s3://logs/pair-1".into(),
            endpoint: Some("http://10.0.0.9:3900".into()),
            region: "garage".into(),
            credentials_file: Some("s3.toml".into()),
            uploader: Uploader::Primary,
            zstd_level: 0,
            key_file: Some("/etc/twinlog/archive.key".into()),
            max_mib_per_s: 10,
            snapshot_every_mib: 1024,
        }),
    }
}

#[test]
fn rendered_files_load_back() {
    let c = sample();
    assert_eq!(
        toml::from_str::<PrimaryConfig>(&c.render()).expect("parse"),
        c
    );
    let t = TwinConfig {
        data_dir: "/d".into(),
        primary: "10.0.0.1:7400".parse().expect("addr"),
        primary_fingerprint: None,
        metrics: "127.0.0.1:9401".parse().expect("addr"),
        segment_bytes: 4096,
        timers: TimersSection::default(),
        restore_listen: Some("0.0.0.0:7401".parse().expect("addr")),
        restore_fingerprints: vec![Fingerprint([3; 32])],
        retention: TwinRetentionSection {
            max_bytes: 256 << 20,
            max_age_secs: 86_400,
        },
        listen_as_primary: "0.0.0.0:7500".parse().expect("addr"),
        restore_expiry: Default::default(),
        promote_quiet_ms: default_promote_quiet_ms(),
        as_primary: AsPrimarySection {
            durability: DurabilitySection {
                policy: Policy::Fallback,
                timeout_ms: 250,
            },
            retention: RetentionSection { max_bytes: 1 << 30 },
            limits: LimitsSection {
                memory_budget_mib: 64,
                max_client_connections: 16,
                ..LimitsSection::default()
            },
        },
        failover: Some(FailoverSection {
            etcd: vec!["http://10.0.0.5:2379".into()],
            cluster: "pair-1".into(),
            lease_ttl_s: 5,
            auto_rejoin: true,
            advertise: None,
            peer: None,
        }),
        archive: Some(ArchiveSection {
            url: "file:///srv/archive".into(),
            endpoint: None,
            region: "us-east-1".into(),
            credentials_file: None,
            uploader: Uploader::Twin,
            zstd_level: 3,
            key_file: None,
            max_mib_per_s: 64,
            snapshot_every_mib: 1024,
        }),
    };
    assert_eq!(toml::from_str::<TwinConfig>(&t.render()).expect("parse"), t);
}

#[test]
fn addresses_are_ip_addresses_or_hostnames_and_resolve_at_use() {
    for ok in [
        "10.0.0.1:7400",
        "[::1]:7400",
        "twin.example:7401",
        "localhost:1",
    ] {
        let a: Address = ok.parse().expect(ok);
        assert_eq!(a.to_string(), ok);
    }
    let local: Address = "localhost:7400".parse().expect("addr");
    let resolved = local.resolve().expect("localhost resolves");
    assert!(resolved.ip().is_loopback() && resolved.port() == 7400);
    for bad in [
        "twin.example",
        "twin.example:http",
        "::1:7400",
        "a b:1",
        ":7400",
        "-x:1",
    ] {
        let e = bad.parse::<Address>().expect_err(bad);
        assert!(e.to_string().contains("HOST:PORT"), "{bad}: {e}");
    }
    let text = sample()
        .render()
        .replace("0.0.0.0:7400", "primary.example:7400");
    let c = toml::from_str::<PrimaryConfig>(&text).expect("a hostname");
    assert_eq!(c.listen.as_str(), "primary.example:7400");
    let text = sample().render().replace("0.0.0.0:7400", "0.0.0.0");
    let e = toml::from_str::<PrimaryConfig>(&text)
        .expect_err("no port")
        .to_string();
    assert!(e.contains("listen") && e.contains("line"), "{e}");
}

#[test]
fn values_that_cannot_work_are_refused_with_the_key_and_line() {
    let cases = [
        (
            "segment_bytes = 1048576",
            "segment_bytes = 10",
            "segment_bytes",
        ),
        ("heartbeat_ms = 20", "heartbeat_ms = 0", "heartbeat_ms"),
        (
            "idle_timeout_ms = 300",
            "idle_timeout_ms = 10",
            "idle_timeout_ms",
        ),
        (
            "heartbeat_ms = 20",
            "heartbeat_ms = 200",
            "twice heartbeat_ms",
        ),
        ("timeout_ms = 250", "timeout_ms = 0", "timeout_ms"),
        ("staging_mib = 2048", "staging_mib = 0", "staging_mib"),
        (
            "staged_body_max_mib = 1024",
            "staged_body_max_mib = 4096",
            "staged_body_max_mib = 4096 is more than staging_mib",
        ),
        (
            "staged_body_max_mib = 1024",
            "staged_body_max_mib = 0",
            "staged_body_max_mib = 0: it must be from 1",
        ),
        (
            "body_piece_timeout_ms = 3000",
            "body_piece_timeout_ms = 10",
            "body_piece_timeout_ms",
        ),
    ];
    for (good, bad, key) in cases {
        let text = sample().render();
        assert!(text.contains(good), "{good}");
        let e = toml::from_str::<PrimaryConfig>(&text.replace(good, bad))
            .expect_err(bad)
            .to_string();
        assert!(e.contains(key) && e.contains("line"), "{bad}: {e}");
    }
}

#[test]
fn unknown_keys_and_bad_values_name_the_key_and_line() {
    let text = sample().render().replace("segment_bytes", "segmnt_bytes");
    let e = toml::from_str::<PrimaryConfig>(&text)
        .expect_err("unknown key")
        .to_string();
    assert!(e.contains("segmnt_bytes") && e.contains("line"), "{e}");
    let text = sample().render().replace("\"fallback\"", "\"sometimes\"");
    let e = toml::from_str::<PrimaryConfig>(&text)
        .expect_err("bad value")
        .to_string();
    assert!(e.contains("sometimes") && e.contains("line"), "{e}");
    let text = sample()
        .render()
        .replace(&Fingerprint([1; 32]).to_string(), "abc");
    let e = toml::from_str::<PrimaryConfig>(&text)
        .expect_err("bad fingerprint")
        .to_string();
    assert!(e.contains("fingerprint") && e.contains("line"), "{e}");
}

#[test]
fn a_twin_s_retention_keys_load_and_a_bad_one_is_named_with_its_line() {
    let t = TwinConfig {
        data_dir: "/d".into(),
        primary: "10.0.0.1:7400".parse().expect("addr"),
        primary_fingerprint: None,
        metrics: "127.0.0.1:9401".parse().expect("addr"),
        segment_bytes: 4096,
        timers: TimersSection::default(),
        restore_listen: None,
        restore_fingerprints: Vec::new(),
        retention: TwinRetentionSection {
            max_bytes: 1 << 30,
            max_age_secs: 3600,
        },
        listen_as_primary: default_listen_as_primary(),
        restore_expiry: Default::default(),
        promote_quiet_ms: default_promote_quiet_ms(),
        as_primary: Default::default(),
        failover: None,
        archive: None,
    };
    let text = t.render();
    assert_eq!(toml::from_str::<TwinConfig>(&text).expect("parse"), t);
    let e = toml::from_str::<TwinConfig>(&text.replace("max_age_secs = 3600", "max_age_secs = -1"))
        .expect_err("negative age")
        .to_string();
    assert!(e.contains("max_age_secs") && e.contains("line"), "{e}");
    let e = toml::from_str::<TwinConfig>(&text.replace("max_bytes", "max_byte"))
        .expect_err("unknown key")
        .to_string();
    assert!(e.contains("max_byte") && e.contains("line"), "{e}");
    // A twin.toml written before the section existed keeps everything.
    let old = text.split("[retention]").next().expect("head").to_owned()
        + &TimersSection::default().render();
    let loaded = toml::from_str::<TwinConfig>(&old).expect("parse");
    assert_eq!(loaded.retention, TwinRetentionSection::default());
}

#[test]
fn a_failover_section_names_a_bad_key_with_its_line() {
    let text = sample().render();
    for (from, to, key) in [
        ("lease_ttl_s = 4", "lease_ttl_s = 1", "lease_ttl_s"),
        ("cluster = \"pair-1\"", "cluster = \"a/b\"", "cluster"),
        (
            "etcd = [\"http://10.0.0.5:2379\", \"http://10.0.0.6:2379\"]",
            "etcd = []",
            "etcd",
        ),
        (
            "etcd = [\"http://10.0.0.5:2379\", \"http://10.0.0.6:2379\"]",
            "etcd = [\"10.0.0.5:2379\"]",
            "etcd",
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let e = toml::from_str::<PrimaryConfig>(&text.replace(from, to))
            .expect_err(to)
            .to_string();
        assert!(e.contains(key) && e.contains("line"), "{e}");
    }
}
