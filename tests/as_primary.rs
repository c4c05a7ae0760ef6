//! What a box serves with once it becomes the primary, and who it lets in:
//! a switchover (or a promotion) writes `primary.toml` from the twin's
//! `[as_primary]` sections, which a deposed primary fills with its own, so
//! limits, retention and durability survive a switchover and back; a
//! handed client whose role is unknown is not pinned at all (never as an
//! admin); and a restore pin's expiry reads the same however the file
//! spells its fingerprint.

use twinlog::daemon::{self, AsPrimarySection, PrimaryConfig, TwinConfig};
use twinlog::net::Fingerprint;
use twinlog::node::epoch::Epochs;
use twinlog::repl::HandedClient;

/// A twin's data directory and configuration, as `twin init` makes them.
fn init_twin(root: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = root.join("twin");
    let (cfg_path, _) = daemon::init_twin(
        &dir,
        std::net::SocketAddr::from(([127, 0, 0, 1], 7400)),
        std::net::SocketAddr::from(([127, 0, 0, 1], 9401)),
        None,
    )
    .expect("init");
    (dir, cfg_path)
}

#[test]
fn a_switchover_serves_with_the_twin_s_as_primary_sections_and_pins_no_unknown_role() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir, cfg_path) = init_twin(root.path());
    let mut cfg = TwinConfig::load(&cfg_path).expect("load");
    assert_eq!(cfg.as_primary, AsPrimarySection::default());
    cfg.as_primary.limits.memory_budget_mib = 64;
    cfg.as_primary.limits.max_client_connections = 16;
    cfg.as_primary.retention.max_bytes = 1 << 30;
    cfg.as_primary.durability.timeout_ms = 250;
    std::fs::write(&cfg_path, cfg.render()).expect("write");
    let cfg = TwinConfig::load(&cfg_path).expect("reload");
    assert_eq!(
        cfg.as_primary.limits.memory_budget_mib, 64,
        "rendered and read back"
    );

    let epochs = Epochs::load(&dir, 0).expect("epochs");
    let (writer, stranger) = (Fingerprint([7; 32]), Fingerprint([9; 32]));
    let clients = vec![
        HandedClient {
            fingerprint: writer.to_string(),
            role: 1,
        },
        HandedClient {
            fingerprint: stranger.to_string(),
            role: 3,
        },
    ];
    daemon::failover::promote_in_place(&cfg, &epochs, 0, clients, None).expect("promote");
    let primary =
        PrimaryConfig::load(&daemon::failover::promoted_config(&cfg)).expect("primary.toml");
    assert_eq!(primary.limits, cfg.as_primary.limits);
    assert_eq!(primary.retention, cfg.as_primary.retention);
    assert_eq!(primary.durability, cfg.as_primary.durability);
    assert_eq!(primary.writer_fingerprints, vec![writer]);
    assert!(
        !primary.client_fingerprints.contains(&stranger)
            && !primary.reader_fingerprints.contains(&stranger),
        "a client of unknown role is pinned in no role"
    );
}

#[test]
fn a_switchover_and_back_keeps_the_twin_s_own_settings() {
    let root = tempfile::tempdir().expect("tempdir");
    let (dir, cfg_path) = init_twin(root.path());
    let mut cfg = TwinConfig::load(&cfg_path).expect("load");
    cfg.promote_quiet_ms = 2_500;
    cfg.retention.max_bytes = 3 << 30;
    cfg.restore_fingerprints = vec![Fingerprint([5; 32])];
    std::fs::write(&cfg_path, cfg.render()).expect("write");
    let cfg = TwinConfig::load(&cfg_path).expect("reload");

    let epochs = Epochs::load(&dir, 0).expect("epochs");
    daemon::failover::promote_in_place(&cfg, &epochs, 0, Vec::new(), None).expect("promote");
    assert!(
        !cfg_path.exists(),
        "twin.toml is set aside while this box is the primary"
    );
    let primary =
        PrimaryConfig::load(&daemon::failover::promoted_config(&cfg)).expect("primary.toml");

    // Switched back: this box follows its old primary again.
    let np = twinlog::node::api::NewPrimary {
        addr: "127.0.0.1:7600".into(),
        fingerprint: Fingerprint([3; 32]).to_string(),
    };
    let twin_path = daemon::failover::follow_after_switchover(&primary, &np).expect("follow");
    let back = TwinConfig::load(&twin_path).expect("twin.toml");
    assert_eq!(back.promote_quiet_ms, 2_500, "the promote window survives");
    assert_eq!(
        back.retention, cfg.retention,
        "the twin's retention survives"
    );
    assert_eq!(back.restore_fingerprints, cfg.restore_fingerprints);
    assert_eq!(back.primary.to_string(), np.addr);
    assert_eq!(back.primary_fingerprint, Some(Fingerprint([3; 32])));
}

#[test]
fn a_restore_expiry_is_read_by_fingerprint_however_the_file_spells_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let (_, cfg_path) = init_twin(root.path());
    let fp = Fingerprint([0xab; 32]);
    let spelled: String = fp
        .to_string()
        .to_uppercase()
        .as_bytes()
        .chunks(2)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join(":");
    let text = std::fs::read_to_string(&cfg_path).expect("read");
    let text = text.replace(
        "restore_fingerprints = []",
        &format!("restore_fingerprints = [\"{spelled}\"]"),
    ) + &format!("\"{spelled}\" = \"2001-01-01T00:00:00Z\"\n");
    std::fs::write(&cfg_path, &text).expect("write");
    let cfg = TwinConfig::load(&cfg_path).expect("load");
    assert_eq!(
        cfg.restore_expiry.get(&fp.to_string()).map(String::as_str),
        Some("2001-01-01T00:00:00Z"),
        "{:?}",
        cfg.restore_expiry
    );
    assert_eq!(cfg.restore_fingerprints, vec![fp]);

    let bad = text.replace(&format!("\"{spelled}\" ="), "\"not-a-fingerprint\" =");
    std::fs::write(&cfg_path, bad).expect("write");
    let e = TwinConfig::load(&cfg_path)
        .expect_err("a bad key")
        .to_string();
    assert!(e.contains("not-a-fingerprint") && e.contains("line"), "{e}");
}
