//! What `init` and the pin commands do: the identity, the configuration,
//! the pins.

use super::*;

/// Write a certificate (0644) and a key (0600, never world-readable even
/// for an instant) into `dir`.
pub fn write_identity(dir: &Path, identity: &Identity) -> Result<(), DaemonError> {
    std::fs::create_dir_all(dir).at("creating the directory", dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .at("making private (0700) the directory", dir)?;
    let key_path = dir.join(KEY_FILE);
    let mut key = match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&key_path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(DaemonError::Key {
                path: key_path,
                what: "a key is there already, left by an earlier init: remove it (and the certificate beside it) to mint a new one".into(),
            })
        }
        Err(e) => return Err(e).at("creating the key", &key_path),
    };
    key.write_all(identity.key_pem().as_bytes())
        .and_then(|()| key.sync_all())
        .at("writing the key", &key_path)?;
    let cert_path = dir.join(CERT_FILE);
    std::fs::write(&cert_path, identity.cert_pem()).at("writing the certificate", &cert_path)?;
    Ok(())
}

/// The admin identity of the primary at `data_dir`, minted and written on
/// first use (a promoted twin has none until then).
pub fn admin_identity(data_dir: &Path) -> Result<Identity, DaemonError> {
    let admin_dir = data_dir.join(ADMIN_DIR);
    if admin_dir.join(KEY_FILE).exists() {
        load_identity(&admin_dir)
    } else {
        let admin = Identity::mint()?;
        write_identity(&admin_dir, &admin)?;
        Ok(admin)
    }
}

/// Load `dir`'s identity; a key that group or others can read is refused,
/// as ssh refuses one.
pub fn load_identity(dir: &Path) -> Result<Identity, DaemonError> {
    let key_path = dir.join(KEY_FILE);
    let key_err = |what: String| DaemonError::Key {
        path: key_path.clone(),
        what,
    };
    let mode = std::fs::metadata(&key_path)
        .map_err(|e| key_err(e.to_string()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(key_err(format!(
            "the key is readable by others (mode {:o}); run chmod 600 on it",
            mode & 0o777
        )));
    }
    let key = std::fs::read_to_string(&key_path).map_err(|e| key_err(e.to_string()))?;
    let cert_path = dir.join(CERT_FILE);
    let cert = std::fs::read_to_string(&cert_path).map_err(|e| DaemonError::Key {
        path: cert_path.clone(),
        what: e.to_string(),
    })?;
    Identity::from_pem(&cert, &key).map_err(|e| match e {
        TlsError::Certificate(why) => DaemonError::Key {
            path: cert_path,
            what: format!(
                "no usable certificate ({why}): expected a PEM \"CERTIFICATE\" block, as `init` writes"
            ),
        },
        TlsError::Key(why) => key_err(format!(
            "no usable private key ({why}): expected a PEM \"PRIVATE KEY\" block (PKCS#8), as `init` writes"
        )),
        other => other.into(),
    })
}

pub(super) fn absolute(dir: &Path) -> Result<PathBuf, DaemonError> {
    Ok(if dir.is_absolute() {
        dir.to_owned()
    } else {
        std::env::current_dir()
            .at("finding the current directory for", dir)?
            .join(dir)
    })
}

pub(super) fn write_config(path: &Path, text: &str) -> Result<(), DaemonError> {
    crate::publish::publish(path, text.as_bytes()).at("writing", path)
}

/// Mint the primary's identity and its admin client's, and write
/// `primary.toml`. Answers the config path and the fingerprint to pin on
/// the twin.
pub fn init_primary(
    data_dir: &Path,
    listen: impl Into<Address>,
    metrics: impl Into<Address>,
    twin: Option<Fingerprint>,
) -> Result<(PathBuf, Fingerprint), DaemonError> {
    let (listen, metrics) = (listen.into(), metrics.into());
    let data_dir = absolute(data_dir)?;
    let config_path = data_dir.join(PRIMARY_CONFIG);
    if config_path.exists()
        || data_dir.join(KEY_FILE).exists()
        || data_dir.join(ADMIN_DIR).join(KEY_FILE).exists()
    {
        return Err(DaemonError::Initialized(data_dir));
    }
    let identity = Identity::mint()?;
    write_identity(&data_dir, &identity)?;
    let admin = Identity::mint()?;
    write_identity(&data_dir.join(ADMIN_DIR), &admin)?;
    let cfg = PrimaryConfig::new(data_dir.clone(), listen, metrics, twin, admin.fingerprint());
    write_config(&config_path, &cfg.render())?;
    Ok((config_path, identity.fingerprint()))
}

/// Mint the twin's identity and write `twin.toml`.
pub fn init_twin(
    data_dir: &Path,
    primary: impl Into<Address>,
    metrics: impl Into<Address>,
    primary_fingerprint: Option<Fingerprint>,
) -> Result<(PathBuf, Fingerprint), DaemonError> {
    let (primary, metrics) = (primary.into(), metrics.into());
    let data_dir = absolute(data_dir)?;
    let config_path = data_dir.join(TWIN_CONFIG);
    if config_path.exists() || data_dir.join(KEY_FILE).exists() {
        return Err(DaemonError::Initialized(data_dir));
    }
    let identity = Identity::mint()?;
    write_identity(&data_dir, &identity)?;
    let cfg = TwinConfig {
        data_dir,
        primary,
        primary_fingerprint,
        metrics,
        segment_bytes: crate::log::DEFAULT_SEGMENT_BYTES,
        timers: Default::default(),
        restore_listen: None,
        restore_fingerprints: Vec::new(),
        retention: Default::default(),
        listen_as_primary: config::default_listen_as_primary(),
        restore_expiry: Default::default(),
        promote_quiet_ms: super::config::default_promote_quiet_ms(),
        as_primary: Default::default(),
        failover: None,
        archive: None,
    };
    write_config(&config_path, &cfg.render())?;
    Ok((config_path, identity.fingerprint()))
}

/// One key a pin command changed: its value before and after.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub key: &'static str,
    pub old: String,
    pub new: String,
}

/// What a pin command did to a configuration file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pinned {
    pub config: PathBuf,
    /// Empty when the file already said so (and was left alone).
    pub changes: Vec<Change>,
    /// The command that serves with this file, to be restarted.
    pub serve: &'static str,
}

impl std::fmt::Display for Pinned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.changes.is_empty() {
            return writeln!(f, "{}: already so, nothing changed", self.config.display());
        }
        for c in &self.changes {
            writeln!(
                f,
                "{}: {}: {} -> {}",
                self.config.display(),
                c.key,
                c.old,
                c.new
            )?;
        }
        writeln!(
            f,
            "a running `{}` reads its configuration only at start: restart it for this to take effect",
            self.serve
        )
    }
}

pub(super) fn shown<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "(none)".to_owned(), |v| v.to_string())
}

pub(super) fn shown_list(fps: &[Fingerprint]) -> String {
    if fps.is_empty() {
        return "[]".into();
    }
    let all: Vec<String> = fps.iter().map(|f| f.to_string()).collect();
    format!("[{}]", all.join(", "))
}

/// Write the file when something changed.
pub(super) fn pinned(
    config: &Path,
    serve: &'static str,
    changes: Vec<Change>,
    text: impl FnOnce() -> String,
) -> Result<Pinned, DaemonError> {
    if !changes.is_empty() {
        write_config(config, &text())?;
    }
    Ok(Pinned {
        config: config.to_owned(),
        changes,
        serve,
    })
}

/// Pin the twin on a primary's configuration.
pub fn pin_twin(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    if cfg.twin_fingerprint != Some(fp) {
        changes.push(Change {
            key: "twin_fingerprint",
            old: shown(cfg.twin_fingerprint),
            new: fp.to_string(),
        });
        cfg.twin_fingerprint = Some(fp);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// Pin a client on a primary's configuration.
pub fn pin_client(
    config_path: &Path,
    fp: Fingerprint,
    role: ClientRole,
) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    for (key, list, in_role) in client_lists(&mut cfg) {
        set_pinned(key, list, fp, in_role == role, &mut changes);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// Put `fp` in `list` or take it out, noting the change if there is one.
pub(super) fn set_pinned(
    key: &'static str,
    list: &mut Vec<Fingerprint>,
    fp: Fingerprint,
    pinned: bool,
    changes: &mut Vec<Change>,
) {
    if list.contains(&fp) == pinned {
        return;
    }
    let old = shown_list(list);
    if pinned {
        list.push(fp);
    } else {
        list.retain(|f| *f != fp);
    }
    changes.push(Change {
        key,
        old,
        new: shown_list(list),
    });
}

/// The primary's client lists: key, fingerprints, role.
pub(super) fn client_lists(
    cfg: &mut PrimaryConfig,
) -> [(&'static str, &mut Vec<Fingerprint>, ClientRole); 3] {
    [
        (
            "client_fingerprints",
            &mut cfg.client_fingerprints,
            ClientRole::Admin,
        ),
        (
            "writer_fingerprints",
            &mut cfg.writer_fingerprints,
            ClientRole::Write,
        ),
        (
            "reader_fingerprints",
            &mut cfg.reader_fingerprints,
            ClientRole::Read,
        ),
    ]
}

/// Unpin a client, whatever its role.
pub fn unpin_client(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut changes = Vec::new();
    for (key, list, _) in client_lists(&mut cfg) {
        set_pinned(key, list, fp, false, &mut changes);
    }
    pinned(config_path, "primary serve", changes, || cfg.render())
}

/// The peers a primary pins, one line each: fingerprint and role.
pub fn primary_pins(config_path: &Path) -> Result<String, DaemonError> {
    let mut cfg = PrimaryConfig::load(config_path)?;
    let mut out = String::new();
    if let Some(fp) = cfg.twin_fingerprint {
        out.push_str(&format!("{fp}  twin\n"));
    }
    for (_, list, role) in client_lists(&mut cfg) {
        for fp in list.iter() {
            out.push_str(&format!("{fp}  client ({role})\n"));
        }
    }
    Ok(out)
}

/// The peers a twin pins, one line each: fingerprint and role.
pub fn twin_pins(config_path: &Path) -> Result<String, DaemonError> {
    let cfg = TwinConfig::load(config_path)?;
    let mut out = String::new();
    if let Some(fp) = cfg.primary_fingerprint {
        out.push_str(&format!("{fp}  primary\n"));
    }
    for fp in &cfg.restore_fingerprints {
        let until = match cfg.restore_expiry.get(&fp.to_string()) {
            Some(at) if parse_utc(at).is_some_and(|t| t <= crate::repl::Now::system().unix_ms) => {
                format!(", EXPIRED {at}")
            }
            Some(at) => format!(", until {at}"),
            None => String::new(),
        };
        out.push_str(&format!("{fp}  restore{until}\n"));
    }
    Ok(out)
}

/// Unpin a box being restored.
pub fn unpin_restore(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let mut changes = Vec::new();
    set_pinned(
        "restore_fingerprints",
        &mut cfg.restore_fingerprints,
        fp,
        false,
        &mut changes,
    );
    cfg.restore_expiry.remove(&fp.to_string());
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// Pin the primary on a twin's configuration.
pub fn pin_primary(config_path: &Path, fp: Fingerprint) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let mut changes = Vec::new();
    if cfg.primary_fingerprint != Some(fp) {
        changes.push(Change {
            key: "primary_fingerprint",
            old: shown(cfg.primary_fingerprint),
            new: fp.to_string(),
        });
        cfg.primary_fingerprint = Some(fp);
    }
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// Allow a box to restore from this twin, serving restores on `listen`.
/// Without `listen`, `restore_listen` must be set already: a pin that
/// serves no restore would enable nothing.
pub fn pin_restore<A: Into<Address>>(
    config_path: &Path,
    fp: Fingerprint,
    listen: Option<A>,
    expires_in: Option<std::time::Duration>,
) -> Result<Pinned, DaemonError> {
    let mut cfg = TwinConfig::load(config_path)?;
    let listen: Option<Address> = listen.map(Into::into);
    if listen.is_none() && cfg.restore_listen.is_none() {
        return Err(DaemonError::NoRestoreListen {
            config: config_path.to_owned(),
        });
    }
    let mut changes = Vec::new();
    if let Some(l) = listen {
        if cfg.restore_listen.as_ref() != Some(&l) {
            changes.push(Change {
                key: "restore_listen",
                old: shown(cfg.restore_listen.as_ref()),
                new: l.to_string(),
            });
            cfg.restore_listen = Some(l);
        }
    }
    set_pinned(
        "restore_fingerprints",
        &mut cfg.restore_fingerprints,
        fp,
        true,
        &mut changes,
    );
    let key = fp.to_string();
    let expiry = expires_in.map(|d| {
        utc(crate::repl::Now::system()
            .unix_ms
            .saturating_add(d.as_millis() as u64))
    });
    let old = cfg.restore_expiry.get(&key).cloned();
    if old != expiry {
        changes.push(Change {
            key: "restore_expiry",
            old: old.unwrap_or_else(|| "never".into()),
            new: expiry.clone().unwrap_or_else(|| "never".into()),
        });
        match expiry {
            Some(at) => cfg.restore_expiry.insert(key, at),
            None => cfg.restore_expiry.remove(&key),
        };
    }
    pinned(config_path, "twin serve", changes, || cfg.render())
}

/// A twin's restore pins, each until its expiry; an expiry that does not
/// parse is refused by name rather than taken as none.
pub(super) fn restore_pins(cfg: &TwinConfig) -> Result<Pins, DaemonError> {
    let mut pins = Pins::new();
    for fp in &cfg.restore_fingerprints {
        pins = match cfg.restore_expiry.get(&fp.to_string()) {
            Some(at) => {
                let until = parse_utc(at).ok_or_else(|| DaemonError::BadRestoreExpiry {
                    fingerprint: *fp,
                    at: at.clone(),
                })?;
                if until <= crate::repl::Now::system().unix_ms {
                    tracing::warn!(%fp, expired = %at, "a restore pin has expired: that box is refused");
                }
                pins.pin_until(*fp, Role::Restore, until)
            }
            None => pins.pin(*fp, Role::Restore),
        };
    }
    Ok(pins)
}
